"""What the batch replenisher carries from one step to the next, and how it is written into a checkpoint.

Two kinds, each with the training step whose generation produced its oldest token (``born``):

* finished informative groups beyond a full batch (``surplus=carry``), as :class:`~dapo_verl.sampler.GroupResult`;
* groups aborted once the batch was full, with the tokens their responses held
  (:class:`~dapo_verl.sampler.engine.PartialGroup`), to be continued at a later step.

A group may be trained, or continued, at step ``s`` only while ``s - born <= max_staleness_steps``
(:func:`fresh`). Both kinds are plain data in :meth:`~dapo_verl.sampler.BatchReplenisher.state_dict`; payloads go
through the sampler's codec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from dapo_verl.sampler.engine import PartialGroup
from dapo_verl.sampler.types import GroupResult, PayloadCodec

__all__ = ["decode_groups", "decode_partials", "encode_groups", "encode_partials", "fresh", "split_stale"]

T = TypeVar("T")


def fresh(born: int, step: int, max_staleness_steps: int) -> bool:
    """Whether something generated from step ``born`` on may still be trained at ``step``."""
    return step - born <= max_staleness_steps


def split_stale(
    carried: Sequence[tuple[int, T]], step: int, max_staleness_steps: int
) -> tuple[list[tuple[int, T]], list[T]]:
    """``carried`` split into what may still be used at ``step`` (in order, with its born step) and what is stale."""
    usable = [(born, item) for born, item in carried if fresh(born, step, max_staleness_steps)]
    stale = [item for born, item in carried if not fresh(born, step, max_staleness_steps)]
    return usable, stale


def encode_groups(carried: Sequence[tuple[int, GroupResult]], codec: PayloadCodec) -> list[dict[str, Any]]:
    """Carried finished groups as plain data."""
    return [
        {
            "born_step": born,
            "prompt_id": g.prompt_id,
            "metric": g.metric,
            "response_lengths": g.response_lengths,
            "truncated": g.truncated,
            "scores": g.scores,
            "payload": codec.encode(g.payload),
        }
        for born, g in carried
    ]


def decode_groups(items: Sequence[Mapping[str, Any]], codec: PayloadCodec) -> list[tuple[int, GroupResult]]:
    """The inverse of :func:`encode_groups`."""
    return [
        (
            int(item["born_step"]),
            GroupResult(
                prompt_id=int(item["prompt_id"]),
                metric=item["metric"],
                response_lengths=item["response_lengths"],
                truncated=item["truncated"],
                scores=item["scores"],
                payload=codec.decode(item["payload"]),
            ),
        )
        for item in items
    ]


def encode_partials(carried: Sequence[tuple[int, PartialGroup]], codec: PayloadCodec) -> list[dict[str, Any]]:
    """Carried aborted groups as plain data."""
    return [
        {
            "born_step": born,
            "prompt_id": p.prompt_id,
            "tokens": p.tokens,
            "finished": p.finished,
            "group_size": p.group_size,
            "payload": codec.encode(p.payload),
        }
        for born, p in carried
    ]


def decode_partials(items: Sequence[Mapping[str, Any]], codec: PayloadCodec) -> list[tuple[int, PartialGroup]]:
    """The inverse of :func:`encode_partials`."""
    return [
        (
            int(item["born_step"]),
            PartialGroup(
                prompt_id=int(item["prompt_id"]),
                tokens=int(item["tokens"]),
                finished=int(item["finished"]),
                group_size=int(item["group_size"]),
                payload=codec.decode(item["payload"]),
            ),
        )
        for item in items
    ]
