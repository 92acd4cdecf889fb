"""What the batch replenisher counts: every generated group, response and token, and where each went.

Accounting is conserved (:meth:`Ledger.conservation_gap`): every finished group is trained, carried, or dropped
for one of :data:`DROP_REASONS`; every aborted group is continued, carried, or dropped for one of
:data:`ABORTED_DROP_REASONS`. Every response token is counted once, when it is generated: an aborted group's tokens
when it is aborted, a continued group's new tokens when it finishes. The per-step metrics
(:mod:`~dapo_verl.sampler.replenisher`'s metrics) are differences of these counters over a step.
"""

from __future__ import annotations

from typing import Any

import torch

from dapo_verl.sampler.engine import PartialGroup, Request
from dapo_verl.sampler.types import GroupResult

__all__ = ["ABORTED_DROP_REASONS", "COUNTERS", "DROP_REASONS", "Ledger"]

DROP_REASONS = ("all_correct", "all_wrong", "zero_spread", "stale", "surplus", "shortfall")
"""Every reason a generated group can leave the sampler without being trained."""

ABORTED_DROP_REASONS = ("stale", "discarded")
"""Every reason an aborted group can leave the sampler without being continued: too old to continue within
``max_staleness_steps``, or aborted with ``surplus=discard``."""

COUNTERS = (
    "train_steps",
    "gen_rounds",
    "prompts_requested",
    "groups_generated",
    "groups_kept",
    "responses_generated",
    "groups_trained",
    "responses_trained",
    "response_tokens_generated",
    "wasted_response_tokens",
    "truncated_responses",
    "metric_sum",
    "score_sum",
    "score_count",
    "prompts_revisited",
    "predicted_groups",
    "predicted_sum",
    "prediction_squared_error",
    "response_tokens_trained",
    "aborted_groups",
    "aborted_responses",
    "aborted_tokens",
    "resumed_groups",
    "resumed_tokens",
    "old_token_steps",
)
"""The running counters (``old_token_steps``: trained tokens times the steps since they were generated)."""


class Ledger:
    """The sampler's counters and drop counts (module docstring)."""

    def __init__(self) -> None:
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self.dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self.dropped_aborted: dict[str, int] = dict.fromkeys(ABORTED_DROP_REASONS, 0)

    def snapshot(self) -> tuple[dict[str, float], dict[str, int], dict[str, int]]:
        """Copies of the counters and drop counts (a step's metrics are differences against them)."""
        return dict(self.counters), dict(self.dropped), dict(self.dropped_aborted)

    def generated(self, group: GroupResult, prefix_tokens: int = 0) -> None:
        """Count a finished group; of a continued one's tokens only those generated since it was aborted are new."""
        c = self.counters
        c["groups_generated"] += 1
        c["responses_generated"] += group.group_size
        c["response_tokens_generated"] += group.num_tokens - prefix_tokens
        c["truncated_responses"] += int(group.truncated.sum())
        c["metric_sum"] += float(group.metric.to(torch.float64).sum())
        if group.scores is not None:
            c["score_sum"] += float(group.scores.to(torch.float64).sum())
            c["score_count"] += group.group_size

    def aborted(self, request: Request, partial: PartialGroup) -> None:
        """Count a group aborted before it finished (its tokens since its request began are new)."""
        c = self.counters
        new_tokens = partial.tokens - request.prefix_tokens
        c["aborted_groups"] += 1
        c["aborted_responses"] += partial.group_size - partial.finished
        c["aborted_tokens"] += new_tokens
        c["response_tokens_generated"] += new_tokens

    def trained(self, batch: list[GroupResult], ages: list[tuple[int, int]]) -> None:
        """Count a step's batch; ``ages``: (steps since generated, tokens) of its tokens older than the step."""
        c = self.counters
        c["groups_trained"] += len(batch)
        c["responses_trained"] += sum(g.group_size for g in batch)
        c["response_tokens_trained"] += sum(g.num_tokens for g in batch)
        c["old_token_steps"] += sum(age * tokens for age, tokens in ages)

    def prediction(self, predicted: float | None, informative: bool) -> None:
        """Calibration counts: the predicted chance of an informative group against what came back."""
        if predicted is None:
            return
        c = self.counters
        c["predicted_groups"] += 1
        c["predicted_sum"] += predicted
        c["prediction_squared_error"] += (predicted - float(informative)) ** 2

    def drop(self, group: GroupResult, reason: str) -> None:
        self.dropped[reason] += 1
        self.counters["wasted_response_tokens"] += group.num_tokens

    def drop_aborted(self, partial: PartialGroup, reason: str) -> None:
        self.dropped_aborted[reason] += 1
        self.counters["wasted_response_tokens"] += partial.tokens

    def conservation_gap(self, carried: int, carried_aborted: int) -> int:
        """generated - (trained + carried + dropped), plus aborted - (continued + carried + dropped); 0 unless a
        group went missing."""
        c = self.counters
        finished = c["groups_generated"] - (c["groups_trained"] + carried + sum(self.dropped.values()))
        aborted = c["aborted_groups"] - (c["resumed_groups"] + carried_aborted + sum(self.dropped_aborted.values()))
        return int(finished) + int(aborted)

    def state_dict(self) -> dict[str, Any]:
        return {
            "counters": dict(self.counters),
            "dropped": dict(self.dropped),
            "dropped_aborted": dict(self.dropped_aborted),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s parts (counters and aborted drops absent from older states start at 0)."""
        self.counters = {k: state["counters"].get(k, 0) for k in COUNTERS}
        self.dropped = {k: int(state["dropped"][k]) for k in DROP_REASONS}
        self.dropped_aborted = {k: int(state.get("dropped_aborted", {}).get(k, 0)) for k in ABORTED_DROP_REASONS}
