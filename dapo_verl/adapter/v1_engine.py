"""verl v1's agent loop as a streaming generation engine (``algorithm.filter_groups.streaming=true``).

:class:`AgentLoopEngine` is the :class:`~dapo_verl.sampler.engine.GenerationEngine` that
:class:`~dapo_verl.adapter.v1_sampler.DapoReplayBuffer` hands its replenisher when streaming. It submits prompts
through the v1 trainer (``_submit_batch_to_rollout``), reports each group as soon as verl's agent loop publishes it
as finished in TransferQueue (a prompt turns ``finished`` once all its sessions are written), and once the batch is
full gives back what is still generating in the way verl's trainer continues it:

* ``colocate_async`` (``resumes_partials``): nothing is aborted here. verl aborts its replicas right after the
  sample (``on_sample_end``), and its ``FullyAsyncLLMServerClient`` continues each request after the weight update
  from its prompt plus the tokens generated so far, within the remaining response budget (verl
  ``workers/rollout/llm_server.py``). The unfinished groups come back as partial groups keyed by their prompt key;
  continuing one (a :class:`~dapo_verl.sampler.engine.Request` with ``resume``) means following that key again.
  TransferQueue holds a response only once it finished, so a partial group's ``tokens`` are those of its finished
  responses; the tokens its unfinished responses held are counted when the group finishes.
* ``sync``: verl's sync client does not continue an aborted request, so the engine aborts the replicas itself
  (verl's ``abort_replicas``), waits until the agent loop has published what every aborted request held, and lets
  generation resume for the next step. Those groups cannot be continued (``resumes_partials`` is false: the
  replenisher drops them as ``discarded``, with their exact tokens). The abort rejects requests that reach a
  replica after its gate closed (``reject_request=True``): the agent loop may still be sending a submitted group's
  requests, and a parked one would wait for the resume, which waits for it -- the sampler would hang. A rejected
  request returns as aborted with no tokens, as verl's server answers it, and its group is discarded with the rest.
  The wait is bounded (:data:`ABORT_WAIT_S`) and names the prompts still open.

Every group's trajectory keys are in its payload (:class:`~dapo_verl.adapter.v1_groups.GroupKeys`), so the buffer
serves or clears it by key, as for rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from dapo_verl.adapter.v1_groups import TERMINAL, GroupKeys, session_of, train_listing, wait_terminal
from dapo_verl.sampler import GroupResult
from dapo_verl.sampler.engine import Aborted, Completion, PartialGroup, Request

__all__ = ["ABORT_WAIT_S", "AgentLoopEngine"]

ABORT_WAIT_S = 300.0
"""Seconds the sync abort waits for the agent loop to publish what the aborted requests held. An aborted request
returns at once; this bounds the agent loop's reward and write for them, and turns a stuck request into an error."""


class AgentLoopEngine:
    """verl v1's agent loop, submitted to and read from TransferQueue, as a streaming engine (module docstring).

    Args:
        submit: Hands prompt ids to verl's agent loop and returns their prompt keys (uids), in order.
        read: Reads finished groups: ``read(prompt_ids, uids, listing)`` (:func:`~dapo_verl.adapter.v1_groups.
            read_round` with the rollout's settings).
        group_size: G, ``actor_rollout_ref.rollout.n``.
        poll_interval: Seconds between TransferQueue listings while nothing has finished.
        abort_replicas: None when verl continues aborted requests itself (``colocate_async``); otherwise a pair of
            callables that abort every in-flight request on the replicas (verl's ``abort_replicas``, called with
            ``reject_request=True``) and let generation resume afterwards.
        abort_wait_s: Bound on the wait for aborted requests to be published (:data:`ABORT_WAIT_S`).
    """

    streaming = True
    """Groups finish one at a time."""

    checks_groups = False
    """The replenisher checks what :func:`~dapo_verl.adapter.v1_groups.read_round` read from TransferQueue."""

    def __init__(
        self,
        submit: Callable[[Sequence[int]], list[str]],
        read: Callable[[Sequence[int], Sequence[str], dict[str, dict]], list[GroupResult]],
        *,
        group_size: int,
        poll_interval: float,
        abort_replicas: tuple[Callable[..., object], Callable[[], object]] | None = None,
        abort_wait_s: float = ABORT_WAIT_S,
    ) -> None:
        self._submit, self._read = submit, read
        self.abort_wait_s = abort_wait_s
        self.group_size = group_size
        self.poll_interval = poll_interval
        self._abort_replicas = abort_replicas
        self._inflight: dict[str, Request] = {}  # prompt key -> the request it answers

    @property
    def resumes_partials(self) -> bool:
        """Whether an aborted group can be continued (verl continues it in ``colocate_async``)."""
        return self._abort_replicas is None

    @property
    def inflight_uids(self) -> list[str]:
        """Prompt keys of the groups generating for the sampler now."""
        return list(self._inflight)

    def submit(self, requests: Sequence[Request]) -> None:
        fresh = [r for r in requests if r.resume is None]
        for request in requests:
            if request.resume is None:
                continue
            if not self.resumes_partials or not isinstance(request.resume.payload, GroupKeys):
                raise ValueError(
                    f"request {request.request_id} continues an aborted group of prompt "
                    f"{request.prompt_id}, but verl's sync client does not continue aborted requests; "
                    f"only colocate_async does. This is a dapo_verl bug."
                )
            self._inflight[request.resume.payload.uid] = request
        if fresh:
            uids = self._submit([r.prompt_id for r in fresh])
            self._inflight.update(zip(uids, fresh, strict=True))

    def collect(self) -> list[Completion]:
        """The groups verl has published as finished since the last call; waits for at least one."""
        while True:
            listing = train_listing()
            done = self._terminal(listing)
            if done:
                return self._finished(done, listing)
            time.sleep(self.poll_interval)

    def abort(self) -> Aborted:
        """Finished groups not collected yet, and every unfinished one as a partial group (module docstring)."""
        listing = train_listing()
        finished = self._finished(self._terminal(listing), listing)
        running = list(self._inflight)
        before = listing
        if running and self._abort_replicas is not None:
            abort, resume = self._abort_replicas
            abort(reject_request=True)  # late arrivals return aborted instead of parking (module docstring)
            listing = wait_terminal(
                running,
                self.poll_interval,
                timeout_s=self.abort_wait_s,
                waiting_for="the aborted requests of a sync step",
            )
            resume()
        partial = [(self._inflight[uid], self._partial(uid, before, listing)) for uid in running]
        self._inflight.clear()
        return Aborted(finished=finished, partial=partial)

    def _terminal(self, listing: dict[str, dict]) -> list[str]:
        return [uid for uid in self._inflight if listing.get(uid, {}).get("status") in TERMINAL]

    def _finished(self, uids: list[str], listing: dict[str, dict]) -> list[Completion]:
        if not uids:
            return []
        requests = [self._inflight.pop(uid) for uid in uids]
        groups = self._read([r.prompt_id for r in requests], uids, listing)
        return list(zip(requests, groups, strict=True))

    def _partial(self, uid: str, before: dict[str, dict], after: dict[str, dict]) -> PartialGroup:
        """``uid``'s group as aborted: the responses finished ``before`` the abort, the tokens held ``after`` it."""
        keys = sorted((k for k in after if k.split("_", 1)[0] == uid and k != uid), key=session_of)
        finished = len({session_of(k)[0] for k in before if k.split("_", 1)[0] == uid and k != uid})
        tokens = sum(int(after[k].get("response_len", 0)) for k in keys)
        payload = GroupKeys(uid, tuple(keys), tuple(dict(after[k]) for k in keys))
        return PartialGroup(
            prompt_id=self._inflight[uid].prompt_id,
            tokens=tokens,
            finished=finished,
            group_size=self.group_size,
            payload=payload,
        )
