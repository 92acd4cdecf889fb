"""The dynamic-sampling batch replenisher (DAPO, arXiv 2503.14476, §3.2): one engine-agnostic sampler.

Each call to :meth:`BatchReplenisher.next_batch` returns exactly ``train_batch_size`` informative prompt
groups. It first takes carried-over groups (``surplus=carry``, oldest first, dropping those older than
``max_staleness_steps``), then generates rounds -- sized by ``refill``, within the step's prompt budget
(:func:`~dapo_verl.sampler.sizing.step_prompt_budget`; with ``on_shortfall=partial`` adaptive refill stops after
one round when the rest of the budget confidently cannot fill the batch, :func:`~dapo_verl.sampler.sizing.yield_stops`)
-- until the batch is full, filtering each group
with :func:`~dapo_verl.core.group_drop_reasons` on the raw metric. Prompts come from a
:class:`~dapo_verl.sampler.stream.PromptStream`, which with ``skip_uninformative`` chooses them by their
predicted chance of an informative group (``prompt_selection=predicted``: a
:class:`~dapo_verl.sampler.prediction.SuccessPredictor` ranks a window of candidates, and the round is sized from
the predicted yield of the prompts taken, :func:`~dapo_verl.sampler.sizing.predicted_request`) or, by default,
passes over prompts after uninformative streaks (``prompt_selection=streak``, :mod:`~dapo_verl.sampler.history`). At
``max_num_gen_batches`` rounds or the end of the budget it either raises (``on_shortfall=error``, saying what
the keep rate was and which knob to turn) or returns the short batch (``partial``, logged at INFO level: the
metric ``partial`` records it). It never returns unfiltered groups and never loops without bound.

Accounting is explicit and conserved: every generated group is trained, carried, or dropped for a named
reason (``all_correct``, ``all_wrong``, ``zero_spread``, ``stale``, ``surplus``, ``shortfall``);
:meth:`BatchReplenisher.conservation_gap` is 0 at all times. Training steps, generation rounds, prompts
consumed and data epochs are separate counters.

The metrics of each step (``dapo/sampler/...``) are listed in :mod:`~dapo_verl.sampler.step_metrics`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from dapo_verl.config import PromptSelection, RefillStrategy, SamplerConfig, ShortfallPolicy, SurplusPolicy
from dapo_verl.core import DropReason, group_drop_reasons
from dapo_verl.sampler.contracts import check_state, checked_groups, restoring
from dapo_verl.sampler.prediction import SuccessPredictor, successes
from dapo_verl.sampler.shortfall import ShortfallError, shortfall_message
from dapo_verl.sampler.sizing import (
    budget_can_fill,
    estimate_sample_size,
    max_request_size,
    predicted_request,
    round_request,
    step_prompt_budget,
    update_keep_rate,
    yield_stops,
)
from dapo_verl.sampler.step_metrics import step_metrics
from dapo_verl.sampler.stream import PromptStream, RoundSize
from dapo_verl.sampler.types import GenerateFn, GroupResult, IdentityCodec, PayloadCodec, SampledBatch

__all__ = ["DROP_REASONS", "BatchReplenisher", "ShortfallError"]

logger = logging.getLogger(__name__)

DROP_REASONS = ("all_correct", "all_wrong", "zero_spread", "stale", "surplus", "shortfall")
"""Every reason a generated group can leave the sampler without being trained."""

_STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)  # version 1 had unsigned streaks and no per-bucket rates: histories restart
_COUNTERS = (
    "train_steps", "gen_rounds", "prompts_requested", "groups_generated", "groups_kept", "responses_generated",
    "groups_trained", "responses_trained", "response_tokens_generated", "wasted_response_tokens",
    "truncated_responses", "metric_sum", "score_sum", "score_count", "prompts_revisited",
    "predicted_groups", "predicted_sum", "prediction_squared_error",
)


class BatchReplenisher:
    """Fills each training batch with informative groups (see the module docstring).

    Args:
        config: Sampler settings (``algorithm.filter_groups.*``, ``data.train_batch_size`` ...).
        num_prompts: Size of the prompt source; ids handed to ``generate`` lie in ``range(num_prompts)``.
        generate: Callback producing one :class:`GroupResult` per requested prompt id.
        codec: Converts carried payloads to plain data for :meth:`state_dict` (default: identity).
        shuffle: Visit prompts in a seeded random order.
    """

    def __init__(
        self,
        config: SamplerConfig,
        num_prompts: int,
        generate: GenerateFn,
        *,
        codec: PayloadCodec | None = None,
        shuffle: bool = True,
    ) -> None:
        self.config = config
        self.generate = generate
        self.codec: PayloadCodec = codec or IdentityCodec()
        predicts = config.enable and config.skip_uninformative and config.prompt_selection == PromptSelection.PREDICTED
        self.predictor = SuccessPredictor(
            half_life_steps=config.prediction_half_life_steps, smoothing_groups=estimate_sample_size(config),
            prefer_informative=config.prefer_informative) if predicts else None
        self.stream = PromptStream(
            num_prompts, seed=config.seed, shuffle=shuffle,
            skip_uninformative=config.skip_uninformative and config.enable,  # without the filter: uniform prompts
            max_skip_probability=config.max_skip_probability, smoothing_groups=estimate_sample_size(config),
            exhausted_streak=config.exhausted_streak,
            revisit_capacity=config.train_batch_size if config.revisit_informative and config.enable else 0,
            scorer=self.predictor, selection_window=config.selection_window, explore_fraction=config.explore_fraction,
        )
        self.keep_rate_estimate: float | None = None
        self.counters: dict[str, float] = dict.fromkeys(_COUNTERS, 0)
        self.dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self.carried: list[tuple[int, GroupResult]] = []  # (step the group was generated for, group)
        self._planned: tuple[list[int], int] | None = None  # next step's first round: (prompt ids, revisits among them)
        self._trained_prompts: set[int] = set()  # every prompt a batch held (the pool's coverage)

    # -- public API ---------------------------------------------------------------------------------

    @property
    def train_steps(self) -> int:
        """Training steps produced so far (the LR schedule's and the run length's unit)."""
        return int(self.counters["train_steps"])

    def next_batch(self) -> SampledBatch:
        """Produce the next training batch (see the module docstring).

        Raises:
            ShortfallError: when a step stops short (round limit, budget, yield) with ``on_shortfall=error``.
            ValueError: if ``generate`` returns malformed groups.
        """
        before = dict(self.counters), dict(self.dropped)
        step = self._set_step()
        target = self.config.train_batch_size
        batch, staleness = self._take_carried(step, target)
        from_carry = len(batch)
        rounds = requested = 0
        budget = step_prompt_budget(self.config)
        while len(batch) < target:
            limit = self._limit_reached(rounds, budget - requested, target - len(batch))
            if limit:
                self._shortfall(batch, step, before, limit=limit)
                break
            rounds += 1
            planned, self._planned = self._planned, None  # only a step's first round can have been planned
            requested += self._run_round(batch, step, target, budget - requested, planned=planned)
        self.counters["train_steps"] = step
        self._trained_prompts.update(g.prompt_id for g in batch)
        self.counters["groups_trained"] += len(batch)
        self.counters["responses_trained"] += sum(g.group_size for g in batch)
        metrics = step_metrics(self, before, len(batch), from_carry, staleness, partial=len(batch) < target)
        return SampledBatch(groups=batch, metrics=metrics, step=step, is_partial=len(batch) < target)

    def plan_next_round(self) -> list[int]:
        """Choose now the prompts of the next step's first round, so a backend can generate them while this step
        trains (verl v1's ``separate_async``); the next :meth:`next_batch` generates exactly these.

        The choice is the one :meth:`next_batch` would make when it starts -- from the same carried groups,
        keep-rate estimate, prompt stream and random state, none of which changes in between -- so planning
        changes when the first round is generated, never which prompts it holds. Calling it again returns the same
        plan. Returns ``[]`` when the carried groups will fill the next batch (no round is needed).
        """
        if self._planned is not None:
            return list(self._planned[0])
        step = self._set_step()
        usable = sum(self._fresh(born, step) for born, _ in self.carried)
        missing = self.config.train_batch_size - usable
        if missing <= 0:
            return []
        self._planned = self._choose_round(missing, step_prompt_budget(self.config))
        return list(self._planned[0])

    def _set_step(self) -> int:
        """The step the next batch is for, told to the predictor (its forgetting counts training steps)."""
        step = self.train_steps + 1
        if self.predictor is not None:
            self.predictor.step = step
        return step

    @property
    def trained_prompts(self) -> int:
        """Distinct prompts any batch has held (``dapo/sampler/pool_trained_fraction`` is their share of the pool)."""
        return len(self._trained_prompts)

    @property
    def pool_exhausted(self) -> bool:
        """True once ``exhausted_pool_fraction`` of the prompt pool is exhausted (``stop_when_exhausted`` reads it)."""
        return self.stream.history.exhausted_fraction >= self.config.exhausted_pool_fraction

    def drop_carried(self, reason: str) -> int:
        """Drop every carried group for ``reason`` (one of :data:`DROP_REASONS`); return how many.

        A backend whose carried payloads cannot outlive a checkpoint (verl v1 in sync mode keeps them in a
        queue that is not saved) calls this before a checkpoint, so the saved state holds no group it cannot
        restore and the accounting stays conserved.
        """
        if reason not in DROP_REASONS:
            raise ValueError(f"reason={reason!r} is not a drop reason; expected one of {DROP_REASONS}.")
        dropped = len(self.carried)
        for _, group in self.carried:
            self._drop(group, reason)
        self.carried = []
        return dropped

    def conservation_gap(self) -> int:
        """generated - (trained + carried + dropped); 0 unless a group went missing."""
        accounted = self.counters["groups_trained"] + len(self.carried) + sum(self.dropped.values())
        return int(self.counters["groups_generated"] - accounted)

    def _limit_reached(self, rounds: int, budget_left: int, missing: int) -> str | None:
        """Why the step must stop generating now (``rounds``, ``budget`` or ``yield``), or None."""
        if rounds >= self.config.max_num_gen_batches:
            return "rounds"
        if budget_left <= 0:
            return "budget"
        if rounds and yield_stops(self.config, missing, self.keep_rate_estimate, budget_left,
                                  self.counters["groups_generated"]):
            return "yield"  # the probe round is done; more would buy a partial batch at a cost nobody agreed to
        return None

    # -- one round ----------------------------------------------------------------------------------

    def _choose_round(self, missing: int, budget_left: int) -> tuple[list[int], int]:
        """The prompts of a round that misses ``missing`` groups, and how many of them are revisits."""
        want = round_request(self.config, missing, self.keep_rate_estimate, budget_left)
        revisit = bool(self.stream.revisit_capacity) and self.stream.history.revisits_pay(
            1.0 / self.config.max_oversample_factor)
        revisited_before = self.stream.prompts_revisited
        prompt_ids, _ = self.stream.take(want, revisit=revisit, size=self._predicted_size(missing, budget_left))
        return prompt_ids, self.stream.prompts_revisited - revisited_before

    def _predicted_size(self, missing: int, budget_left: int) -> RoundSize | None:
        """Sizes a round from the predicted yield of the prompts it takes (:func:`predicted_request`), within the
        bounds the keep rate sets, asking the stream for more candidates while the best it drew fall short; None
        where the predictions do not size it (no prediction yet, barrier rounds, or a probe round when the budget
        cannot be expected to fill the batch)."""
        predictor, config = self.predictor, self.config
        if (predictor is None or predictor.group_size is None or self.keep_rate_estimate is None
                or config.refill == RefillStrategy.BARRIER
                or not budget_can_fill(config, missing, self.keep_rate_estimate, budget_left)):
            return None
        cap = max(1, min(budget_left, max_request_size(config, missing)))

        def size(predictions: list[float], final: bool) -> int | None:  # predictions already calibrated
            count, met = predicted_request(config, missing, predictions, None, stop_at_floor=not final)
            return min(cap, count) if met or final else None

        return size

    def _run_round(self, batch: list[GroupResult], step: int, target: int, budget_left: int, *,
                   planned: tuple[list[int], int] | None = None) -> int:
        """Generate, filter and place one round's groups (``planned``: by :meth:`plan_next_round`); return the
        number of prompts requested."""
        prompt_ids, revisited = planned or self._choose_round(target - len(batch), budget_left)
        self.counters["prompts_revisited"] += revisited
        groups = checked_groups(prompt_ids, self.generate(prompt_ids))  # the callback contract (.contracts)
        self.counters["gen_rounds"] += 1
        self.counters["prompts_requested"] += len(prompt_ids)
        reasons = self._reasons(groups)
        kept = 0
        for group, reason in zip(groups, reasons):
            self._count_generated(group)
            informative = reason == DropReason.KEEP
            predicted = self.stream.record(group.prompt_id, reason, correct=successes(group.metric),
                                           group_size=group.group_size)
            if self.predictor is not None:
                self._count_prediction(predicted, informative)
            if not informative and self.config.enable:
                self._drop(group, reason.label)
                continue
            kept += 1
            self.counters["groups_kept"] += 1
            if len(batch) < target:
                batch.append(group)
            elif self.config.surplus == SurplusPolicy.CARRY:
                self.carried.append((step, group))
            else:
                self._drop(group, "surplus")
        self.keep_rate_estimate = update_keep_rate(
            self.keep_rate_estimate, kept, len(groups), self.config.keep_rate_smoothing,
            round_size=self.config.train_batch_size,
        )
        return len(prompt_ids)

    def _count_prediction(self, predicted: float | None, informative: bool) -> None:
        """Calibration counts: the predicted chance of an informative group against what came back."""
        if predicted is None:
            return
        c = self.counters
        c["predicted_groups"] += 1
        c["predicted_sum"] += predicted
        c["prediction_squared_error"] += (predicted - float(informative)) ** 2

    def _reasons(self, groups: Sequence[GroupResult]) -> list[DropReason]:
        metric = torch.stack([g.metric.detach().to("cpu", torch.float32) for g in groups])  # (P, G)
        return [DropReason(int(code)) for code in group_drop_reasons(metric)]

    # -- carry, drop, shortfall ---------------------------------------------------------------------

    def _fresh(self, born: int, step: int) -> bool:
        """Whether a group generated for step ``born`` may still be trained at ``step`` (``max_staleness_steps``)."""
        return step - born <= self.config.max_staleness_steps

    def _take_carried(self, step: int, target: int) -> tuple[list[GroupResult], list[int]]:
        fresh = []
        for born, group in self.carried:
            if not self._fresh(born, step):
                self._drop(group, "stale")
            else:
                fresh.append((born, group))
        taken, self.carried = fresh[:target], fresh[target:]
        return [g for _, g in taken], [step - born for born, _ in taken]

    def _drop(self, group: GroupResult, reason: str) -> None:
        self.dropped[reason] += 1
        self.counters["wasted_response_tokens"] += group.num_tokens

    def _count_generated(self, group: GroupResult) -> None:
        c = self.counters
        c["groups_generated"] += 1
        c["responses_generated"] += group.group_size
        c["response_tokens_generated"] += group.num_tokens
        c["truncated_responses"] += int(group.truncated.sum())
        c["metric_sum"] += float(group.metric.to(torch.float64).sum())
        if group.scores is not None:
            c["score_sum"] += float(group.scores.to(torch.float64).sum())
            c["score_count"] += group.group_size

    def _shortfall(self, batch: list[GroupResult], step: int, before: tuple[dict, dict], *, limit: str) -> None:
        """The step stops short (``limit``): train on the batch (``partial``) or drop it and raise."""
        counters = {key: int(self.counters[key] - before[0][key])
                    for key in ("groups_generated", "gen_rounds", "prompts_requested", "groups_kept")}
        message = shortfall_message(self.config, step=step, found=len(batch), limit=limit, counters=counters,
                                    keep_rate_estimate=self.keep_rate_estimate)
        if self.config.on_shortfall == ShortfallPolicy.PARTIAL:  # the user chose this: dapo/sampler/partial says so
            logger.info("%s Training on the %d groups found.", message, len(batch))
            return
        for group in batch:
            self._drop(group, "shortfall")
        batch.clear()
        raise ShortfallError(message)

    # -- state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: counters, keep-rate estimate, stream, carried groups.

        Plain data only (nested dicts/lists of tensors, numbers, strings): save it with
        :func:`dapo_verl.state_io.save_state`.
        """
        return {
            "version": _STATE_VERSION,
            "counters": dict(self.counters),
            "dropped": dict(self.dropped),
            "keep_rate_estimate": self.keep_rate_estimate,
            "stream": self.stream.state_dict(),
            "carried": [
                {
                    "born_step": born,
                    "prompt_id": g.prompt_id,
                    "metric": g.metric,
                    "response_lengths": g.response_lengths,
                    "truncated": g.truncated,
                    "scores": g.scores,
                    "payload": self.codec.encode(g.payload),
                }
                for born, g in self.carried
            ],
            "planned": None if self._planned is None else {"prompt_ids": list(self._planned[0]),
                                                           "revisited": self._planned[1]},
            "trained_prompts": sorted(self._trained_prompts),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the prompt source must be the same size).

        Version 1 states (before measured skipping) are read too: everything is restored except the prompt
        histories, which start afresh because version 1 did not record a streak's kind. The state is checked
        first, and a load that fails leaves the sampler as it was (:mod:`.contracts`).

        Raises:
            TypeError, ValueError: naming what is wrong with ``state``.
        """
        check_state(state, _READABLE_VERSIONS)
        with restoring(self.state_dict, self._restore):
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        self.counters = {k: state["counters"].get(k, 0) for k in _COUNTERS}
        self.dropped = {k: int(state["dropped"][k]) for k in DROP_REASONS}
        self.keep_rate_estimate = state["keep_rate_estimate"]
        self.stream.load_state_dict(state["stream"])
        self.carried = [
            (
                int(item["born_step"]),
                GroupResult(
                    prompt_id=int(item["prompt_id"]), metric=item["metric"],
                    response_lengths=item["response_lengths"], truncated=item["truncated"],
                    scores=item["scores"], payload=self.codec.decode(item["payload"]),
                ),
            )
            for item in state["carried"]
        ]
        planned = state.get("planned")  # absent in states written before plan_next_round existed
        self._planned = None if planned is None else ([int(i) for i in planned["prompt_ids"]],
                                                      int(planned["revisited"]))
        self._trained_prompts = {int(i) for i in state.get("trained_prompts", [])}  # absent before coverage was kept
