"""A generation round's groups, read out of TransferQueue as verl's v1 agent loop leaves them.

:class:`~dapo_verl.adapter.v1_sampler.DapoReplayBuffer` submits a round's prompts to verl's agent loop; this
module is the other half of its generate callback: :func:`wait_terminal` polls TransferQueue's ``train``
partition until every prompt of the round is finished (or failed), and :func:`read_round` turns each prompt's
trajectories into the :class:`~dapo_verl.sampler.GroupResult` the batch replenisher filters -- the filter
metric and the shaped score of each session's last output (multi-turn loops reward a session there), the
response lengths and truncation from the keys' tags, and the trajectory keys themselves as the payload
(:class:`GroupKeys`), so a selected group is served by key and a dropped one cleared by key.

Keys follow verl's layout: a prompt's key is its ``uid`` (with no ``_``), and its trajectories are
``{uid}_{session}_{output}``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import transfer_queue as tq

from dapo_verl.sampler import GroupResult

__all__ = ["TERMINAL", "GroupKeys", "GroupKeysCodec", "read_round", "session_of", "train_listing", "wait_terminal"]

TERMINAL = ("finished", "failure")
"""The prompt statuses verl's agent loop ends a group with."""


@dataclass(frozen=True)
class GroupKeys:
    """A group's payload in v1: where its trajectories live in TransferQueue.

    Attributes:
        uid: The prompt key (``uid``); trajectory keys are ``{uid}_{session}_{output}``.
        keys: The trajectory keys, in session order.
        tags: Their TransferQueue tags (``seq_len``, ``min/max_global_steps``, ... -- what the trainer reads).
    """

    uid: str
    keys: tuple[str, ...]
    tags: tuple[dict[str, Any], ...]


class GroupKeysCodec:
    """Carried payloads as plain data for the sampler's state file (the trajectories stay in TransferQueue)."""

    def encode(self, payload: GroupKeys) -> dict[str, Any]:
        """The payload as plain data."""
        return {"uid": payload.uid, "keys": list(payload.keys), "tags": [dict(t) for t in payload.tags]}

    def decode(self, data: dict[str, Any]) -> GroupKeys:
        """The payload back from :meth:`encode`'s data."""
        return GroupKeys(data["uid"], tuple(data["keys"]), tuple(data["tags"]))


def train_listing() -> dict[str, dict]:
    """TransferQueue's ``train`` partition: key -> tags."""
    return (tq.kv_list(partition_id="train") or {}).get("train", {})


def session_of(key: str) -> tuple[int, int]:
    """(session, output) of a trajectory key ``{uid}_{session}_{output}``."""
    _, session, output = key.rsplit("_", 2)
    return int(session), int(output)


def wait_terminal(
    uids: Sequence[str], poll_interval: float, *, timeout_s: float | None = None, waiting_for: str = "generation"
) -> dict[str, dict]:
    """Poll TransferQueue until every prompt in ``uids`` is finished or failed; return the ``train`` listing.

    Args:
        uids: Prompt keys to wait for.
        poll_interval: Seconds between listings.
        timeout_s: None waits as long as generation takes (a round's length has no bound worth guessing); a number
            bounds a wait that should be short, such as for aborted requests to publish what they held.
        waiting_for: What the wait is for, named in the timeout's error.

    Raises:
        TimeoutError: when ``timeout_s`` passes first; it names the prompts still open and their statuses.
    """
    pending = set(uids)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        listing = train_listing()
        pending = {uid for uid in pending if listing.get(uid, {}).get("status") not in TERMINAL}
        if not pending:
            return listing
        if deadline is not None and time.monotonic() > deadline:
            statuses = {uid: listing.get(uid, {}).get("status", "absent") for uid in sorted(pending)[:8]}
            raise TimeoutError(
                f"{len(pending)} of {len(uids)} prompts were not published as finished or failed within "
                f"{timeout_s:g} s of waiting for {waiting_for} (statuses, up to 8: {statuses}). verl's agent loop "
                f"publishes a prompt once every response of it returned; one that never returns is stuck in the "
                f"agent loop or the rollout server: see their logs."
            )
        time.sleep(poll_interval)


def read_round(
    prompt_ids: Sequence[int], uids: Sequence[str], listing: dict[str, dict], *, metric: str, response_length: int
) -> list[GroupResult]:
    """The round's groups, one per prompt id, in order, from the ``listing`` :func:`wait_terminal` returned.

    The round is read with one listing, indexed by prompt key once, and one ``kv_batch_get`` of every session's
    last output: the driver's cost grows with the round, not with its square.

    Args:
        prompt_ids: The round's prompt ids (dataset positions).
        uids: Their prompt keys in TransferQueue.
        listing: TransferQueue's ``train`` partition once every prompt is terminal.
        metric: ``algorithm.filter_groups.metric``: the reward extra-info key the sampler filters on.
        response_length: The rollout's response budget, for truncation when the reward does not report it.

    Raises:
        RuntimeError: for a prompt verl's agent loop failed.
        ValueError: when the reward's extra info lacks ``metric``.
    """
    trajectories: dict[str, list[str]] = {uid: [] for uid in uids}
    for key in listing:
        head = key.split("_", 1)[0]
        if head != key and head in trajectories:
            trajectories[head].append(key)
    sessions = []
    for prompt_id, uid in zip(prompt_ids, uids):
        keys = sorted(trajectories[uid], key=session_of)
        if listing[uid].get("status") == "failure" or not keys:
            raise RuntimeError(
                f"verl's agent loop failed for prompt {prompt_id} (uid {uid}); see the agent-loop "
                f"worker's log. dapo_verl does not train on failed groups."
            )
        final: dict[int, str] = {}
        for key in keys:  # the last output of each session carries the session's reward (multi-turn loops)
            final[session_of(key)[0]] = key
        sessions.append((keys, [final[s] for s in sorted(final)]))
    finals = [key for _, last in sessions for key in last]
    values = tq.kv_batch_get(keys=finals, partition_id="train", select_fields=["extra_fields", "rm_scores"])
    read = dict(zip(finals, zip(values["extra_fields"], values["rm_scores"], strict=True), strict=True))
    return [
        _group(prompt_id, uid, keys, last, read, listing, metric=metric, response_length=response_length)
        for prompt_id, uid, (keys, last) in zip(prompt_ids, uids, sessions)
    ]


def _group(
    prompt_id: int,
    uid: str,
    keys: list[str],
    finals: list[str],
    read: dict[str, tuple[Any, torch.Tensor]],
    listing: dict[str, dict],
    *,
    metric: str,
    response_length: int,
) -> GroupResult:
    """One prompt's group from its trajectory ``keys``, the last output of each session (``finals``) and what was
    read of them."""
    values, scores, truncated = [], [], []
    for key in finals:
        extra, rm = read[key]
        info = (getattr(extra, "data", extra) or {}).get("reward_extra_info", {})
        if metric not in info:
            raise ValueError(
                f"algorithm.filter_groups.metric={metric!r} is not in the reward's extra info (available: "
                f"{sorted(info)}); the reward manager must report it per response. Use acc with "
                f"reward.reward_manager.name=dapo_verl."
            )
        values.append(float(info[metric]))
        scores.append(float(rm.sum()))
        length = int(listing[key].get("response_len", 0))
        truncated.append(bool(info.get("truncated", length >= response_length)))
    lengths = [int(listing[k].get("response_len", 0)) for k in finals]
    return GroupResult(
        prompt_id=int(prompt_id),
        metric=torch.tensor(values, dtype=torch.float64),
        response_lengths=torch.tensor(lengths),
        truncated=torch.tensor(truncated),
        scores=torch.tensor(scores),
        payload=GroupKeys(uid, tuple(keys), tuple(dict(listing[k]) for k in keys)),
    )
