"""The dynamic-sampling batch replenisher (DAPO, arXiv 2503.14476, §3.2): one engine-agnostic sampler.

Each call to :meth:`BatchReplenisher.next_batch` returns exactly ``train_batch_size`` informative prompt
groups. It first takes carried-over groups (``surplus=carry``, oldest first, dropping those older than
``max_staleness_steps``), continues carried aborted groups (oldest first, before any new prompt, so long responses
are not starved), then generates new prompts -- sized by ``refill``, within the step's prompt budget
(:func:`~dapo_verl.sampler.sizing.step_prompt_budget`; with ``on_shortfall=partial`` adaptive refill stops after
one round when the rest of the budget cannot be expected to fill the batch, :func:`~dapo_verl.sampler.sizing.
yield_stops`) -- until the batch is full, filtering each group with :func:`~dapo_verl.core.group_drop_reasons`.

Generation goes through an engine (:mod:`~dapo_verl.sampler.engine`). A streaming engine reports groups as they
finish: the replenisher counts informative groups as they arrive, keeps in flight what a round would ask for the
groups still missing (the same keep-rate sizing, less what is already in flight), tops up as groups are dropped,
and aborts what is still generating the moment the batch is full -- finished surplus and aborted groups are carried
(``surplus=carry``, continued at the next step from their prefix) or dropped (``discard``). A round-based
``generate(prompt_ids)`` callback is the engine whose groups all finish at once (:class:`~dapo_verl.sampler.engine.
RoundEngine`): every top-up is then a new round, and the replenisher generates the rounds it always did.

Prompts come from a :class:`~dapo_verl.sampler.stream.PromptStream`, which with ``skip_uninformative`` chooses them
by their predicted chance of an informative group (``prompt_selection=predicted``: a
:class:`~dapo_verl.sampler.prediction.SuccessPredictor` ranks a window of candidates, and a round is sized from
the predicted yield of the prompts taken, :func:`~dapo_verl.sampler.sizing.predicted_request`) or, by default,
passes over prompts after uninformative streaks (``prompt_selection=streak``, :mod:`~dapo_verl.sampler.history`). At
``max_num_gen_batches`` rounds or the end of the budget, with nothing left in flight, it either raises
(``on_shortfall=error``, saying what the keep rate was and which knob to turn) or returns the short batch
(``partial``: an INFO line and the metric ``partial``). It never returns unfiltered groups nor loops without bound.

Accounting is conserved (:mod:`~dapo_verl.sampler.ledger`; :meth:`BatchReplenisher.conservation_gap` is 0 at all
times).

Metrics: what the replenisher reports for each training step, keyed ``dapo/sampler/<name>``.

Counts are this step's (the difference of the sampler's counters over the step); states are as the step ends.

* the step: ``train_step``, ``gen_rounds``, ``prompts_requested``, ``prompts_skipped``, ``prompts_revisited``,
  ``prompts_consumed``, ``data_epoch``, ``groups_generated``, ``groups_trained``, ``groups_from_carry``,
  ``dropped/<reason>``, ``partial``;
* what was generated: ``prefilter_acc`` and ``prefilter_score`` (over every generated response, before
  filtering), ``keep_rate`` (this step) and ``keep_rate_estimate``, ``responses_generated``,
  ``responses_trained``, ``generated_per_trained``, ``wasted_response_tokens``, ``truncated_fraction``;
* carried groups: ``carried_groups``, ``carried_staleness_mean`` / ``max``;
* tokens and streaming (:mod:`~dapo_verl.sampler.engine`): ``response_tokens_generated`` (every token generated this
  step, aborted ones included), ``response_tokens_trained``, ``tokens_generated_per_trained``, ``aborted_groups``,
  ``aborted_responses`` and ``aborted_tokens`` (unfinished when the batch filled), ``resumed_groups`` and
  ``resumed_tokens`` (aborted groups continued this step, and the tokens they already held), ``carried_aborted_groups``,
  ``dropped_aborted/<reason>``, ``inflight_at_full`` (groups still generating when the batch filled),
  ``trained_token_age_mean`` / ``max`` (steps since the trained tokens were generated; a continued group's prefix
  counts from the step it was first submitted in, an upper bound);
* the prompt pool (:mod:`~dapo_verl.sampler.history`): ``history_size``, ``pool_exhausted_fraction``,
  ``pool_solved_fraction``, ``pool_failed_fraction``, ``pool_exhausted`` (1 once ``exhausted_pool_fraction`` of
  the pool is exhausted), ``pool_trained_fraction`` (share of the pool any batch has held), ``keep_rate_no_streak``
  and ``keep_rate_streak`` (measured informative rates of prompts without and with an uninformative streak),
  ``keep_rate_stream``, ``keep_rate_revisit``, ``revisits_waiting``;
* with prediction (:mod:`~dapo_verl.sampler.prediction`): ``predicted_keep_rate`` (mean predicted chance of an
  informative group over this step's generated prompts, against the observed ``keep_rate``), ``prediction_brier``
  (their mean squared error), ``prediction_calibration`` (observed over the model's predicted informative
  groups), ``calibration_after_informative`` and ``calibration_others`` (the factors applied to prompts whose last
  group was informative and to all others) and ``predictor_size`` (prompts with a belief of their own).

A rate that is not known yet (nothing measured or predicted) is -1: metrics must be numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

from dapo_verl.config import PromptSelection, SamplerConfig, ShortfallPolicy, SurplusPolicy
from dapo_verl.core import DropReason
from dapo_verl.sampler.arguments import require_instance
from dapo_verl.sampler.carry import decode_groups, decode_partials, encode_groups, encode_partials, fresh, split_stale
from dapo_verl.sampler.contracts import check_state, restoring
from dapo_verl.sampler.engine import Completion, GenerationEngine, PartialGroup, RoundEngine, as_engine
from dapo_verl.sampler.flight import Flight
from dapo_verl.sampler.ledger import ABORTED_DROP_REASONS, DROP_REASONS, Ledger
from dapo_verl.sampler.prediction import SuccessPredictor, successes
from dapo_verl.sampler.shortfall import ShortfallError, shortfall_message
from dapo_verl.sampler.sizing import (
    estimate_sample_size,
    inflight_target,
    predicted_round_size,
    step_prompt_budget,
    update_keep_rate,
    yield_stops,
)
from dapo_verl.sampler.stream import PromptStream
from dapo_verl.sampler.types import GenerateFn, GroupResult, IdentityCodec, PayloadCodec, SampledBatch
from dapo_verl.sampler.verdicts import drop_reasons

__all__ = ["ABORTED_DROP_REASONS", "DROP_REASONS", "BatchReplenisher", "ShortfallError"]

logger = logging.getLogger(__name__)

_STATE_VERSION = 3
_READABLE_VERSIONS = (1, 2, 3)  # 1: unsigned streaks, no per-bucket rates (histories restart); 2: no aborted groups


class BatchReplenisher:
    """Fills each training batch with informative groups (see the module docstring).

    Args:
        config: Sampler settings (``algorithm.filter_groups.*``, ``data.train_batch_size`` ...).
        num_prompts: Size of the prompt source; ids handed to the engine lie in ``range(num_prompts)``.
        generate: A :class:`~dapo_verl.sampler.engine.GenerationEngine`, or a round-based callback producing one
            :class:`GroupResult` per requested prompt id (run as a :class:`~dapo_verl.sampler.engine.RoundEngine`).
        codec: Converts carried payloads to plain data for :meth:`state_dict` (default: identity).
        shuffle: Visit prompts in a seeded random order.
    """

    def __init__(
        self,
        config: SamplerConfig,
        num_prompts: int,
        generate: GenerateFn | GenerationEngine,
        *,
        codec: PayloadCodec | None = None,
        shuffle: bool = True,
    ) -> None:
        self.config = require_instance("config", config, SamplerConfig, fix="Use DapoConfig.sampler.")
        self.generate = generate
        # A callback is looked up on each round, so a caller may replace ``generate`` (a wrapper, a spy).
        self.engine: GenerationEngine = as_engine(generate) or RoundEngine(
            lambda prompt_ids: cast(GenerateFn, self.generate)(prompt_ids)
        )
        self.codec: PayloadCodec = codec or IdentityCodec()
        predicts = config.enable and config.skip_uninformative and config.prompt_selection == PromptSelection.PREDICTED
        self.predictor = (
            SuccessPredictor(
                half_life_steps=config.prediction_half_life_steps,
                smoothing_groups=estimate_sample_size(config),
                prefer_informative=config.prefer_informative,
            )
            if predicts
            else None
        )
        self.stream = PromptStream(
            num_prompts,
            seed=config.seed,
            shuffle=shuffle,
            skip_uninformative=config.skip_uninformative and config.enable,  # without the filter: uniform prompts
            max_skip_probability=config.max_skip_probability,
            smoothing_groups=estimate_sample_size(config),
            exhausted_streak=config.exhausted_streak,
            revisit_capacity=config.train_batch_size if config.revisit_informative and config.enable else 0,
            scorer=self.predictor,
            selection_window=config.selection_window,
            explore_fraction=config.explore_fraction,
        )
        self.keep_rate_estimate: float | None = None
        self.ledger = Ledger()
        self.carried: list[tuple[int, GroupResult]] = []  # finished groups: (step of their oldest token, group)
        self.carried_aborted: list[tuple[int, PartialGroup]] = []  # aborted groups, likewise
        self._flight = Flight(self.engine)  # what is generating now (nothing between steps)
        self._planned: tuple[list[int], int] | None = None  # next step's first round: (prompt ids, revisits among them)
        self._trained_prompts: set[int] = set()  # every prompt a batch held (the pool's coverage)

    # -- public API ---------------------------------------------------------------------------------

    @property
    def counters(self) -> dict[str, float]:
        """The running counters (:data:`~dapo_verl.sampler.ledger.COUNTERS`)."""
        return self.ledger.counters

    @property
    def dropped(self) -> dict[str, int]:
        """Finished groups dropped, by reason (:data:`DROP_REASONS`)."""
        return self.ledger.dropped

    @property
    def train_steps(self) -> int:
        """Training steps produced so far (the LR schedule's and the run length's unit)."""
        return int(self.counters["train_steps"])

    def next_batch(self, *, settle: bool = False) -> SampledBatch:
        """Produce the next training batch (see the module docstring).

        Args:
            settle: Leave nothing partial: continue every carried aborted group and, once the batch is full, let what
                is in flight finish instead of aborting it (finished groups beyond the batch are carried or dropped
                as surplus). For a step that a checkpoint follows when the engine's partial groups cannot be saved.

        Raises:
            ShortfallError: when a step stops short (round limit, budget, yield) with ``on_shortfall=error``.
            ValueError: if the engine returns malformed groups.
        """
        before = self.ledger.snapshot()
        step = self._set_step()
        target = self.config.train_batch_size
        batch, ages = self._take_carried(step, target)
        from_carry = len(batch)
        rounds = requested = 0
        budget = step_prompt_budget(self.config)
        self._resume_aborted(step, target - len(batch), budget, every=settle)
        while len(batch) < target:
            missing = target - len(batch)
            if self._flight:  # a streaming engine: top up what a round would ask for, less what is in flight
                requested += self._submit_new(step, missing, budget - requested, top_up=True)
            else:
                limit = self._limit_reached(rounds, budget - requested, missing)
                if limit:
                    self._shortfall(batch, step, before, limit=limit)
                    break
                rounds += 1
                requested += self._submit_new(step, missing, budget - requested, top_up=False)
            self._place(self._flight.collect(), batch, ages, step, target)
        inflight_at_full = len(self._flight)
        while settle and self._flight:
            self._place(self._flight.collect(), batch, ages, step, target)
        self._abort_rest(batch, ages, step, target)
        self.counters["train_steps"] = step
        self._trained_prompts.update(g.prompt_id for g in batch)
        self.ledger.trained(batch, ages)
        metrics = step_metrics(
            self, before, len(batch), from_carry, ages, partial=len(batch) < target, inflight_at_full=inflight_at_full
        )
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
        missing = self.config.train_batch_size - self.fresh_carried(self._set_step())
        if missing <= 0:
            return []
        self._planned = self._choose(missing, step_prompt_budget(self.config))
        return list(self._planned[0])

    def fresh_carried(self, step: int) -> int:
        """How many carried finished groups step ``step`` may still train on (``max_staleness_steps``)."""
        return sum(fresh(born, step, self.config.max_staleness_steps) for born, _ in self.carried)

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
        """Drop every carried finished group for ``reason`` (one of :data:`DROP_REASONS`); return how many.

        A backend whose carried payloads cannot outlive a checkpoint (verl v1 in sync mode keeps them in a
        queue that is not saved) calls this before a checkpoint, so the saved state holds no group it cannot
        restore and the accounting stays conserved.
        """
        if reason not in DROP_REASONS:
            raise ValueError(f"reason={reason!r} is not a drop reason; expected one of {DROP_REASONS}.")
        dropped = len(self.carried)
        for _, group in self.carried:
            self.ledger.drop(group, reason)
        self.carried = []
        return dropped

    def conservation_gap(self) -> int:
        """0 unless a group went missing (:meth:`~dapo_verl.sampler.ledger.Ledger.conservation_gap`)."""
        return self.ledger.conservation_gap(len(self.carried), len(self.carried_aborted))

    def _limit_reached(self, rounds: int, budget_left: int, missing: int) -> str | None:
        """Why the step must stop generating now (``rounds``, ``budget`` or ``yield``), or None."""
        if rounds >= self.config.max_num_gen_batches:
            return "rounds"
        if budget_left <= 0:
            return "budget"
        if rounds and yield_stops(
            self.config, missing, self.keep_rate_estimate, budget_left, self.counters["groups_generated"]
        ):
            return "yield"  # the probe round is done; more would buy a partial batch at a cost nobody agreed to
        return None

    # -- submitting ---------------------------------------------------------------------------------

    def _choose(self, missing: int, budget_left: int, inflight: int = 0) -> tuple[list[int], int]:
        """The new prompts to generate for ``missing`` groups with ``inflight`` groups already generating, and how
        many of them are revisits (none when what is in flight already covers the round)."""
        want = (
            inflight_target(
                self.config, missing, self.keep_rate_estimate, budget_left + inflight, streaming=self.engine.streaming
            )
            - inflight
        )
        if want <= 0:
            return [], 0
        stream, revisited_before = self.stream, self.stream.prompts_revisited
        revisit = bool(stream.revisit_capacity) and stream.history.revisits_pay(1.0 / self.config.max_oversample_factor)
        size = (
            None
            if inflight
            else predicted_round_size(self.config, self.predictor, self.keep_rate_estimate, missing, budget_left)
        )
        prompt_ids, _ = stream.take(min(want, budget_left), revisit=revisit, size=size)
        return prompt_ids, stream.prompts_revisited - revisited_before

    def _submit_new(self, step: int, missing: int, budget_left: int, *, top_up: bool) -> int:
        """Submit new prompts for ``missing`` groups: a round (the first of a step may have been planned), or a top-up
        of what is in flight, which the budget and the yield rule may refuse; return the prompts submitted."""
        planned, self._planned = self._planned, None  # only a step's first new prompts can have been planned
        if (
            top_up
            and not planned
            and (
                budget_left <= 0
                or yield_stops(
                    self.config, missing, self.keep_rate_estimate, budget_left, self.counters["groups_generated"]
                )
            )
        ):
            return 0
        prompt_ids, revisited = planned or self._choose(missing, budget_left, len(self._flight) if top_up else 0)
        self.counters["prompts_revisited"] += revisited
        self.counters["prompts_requested"] += len(prompt_ids)
        self.counters["gen_rounds"] += int(not top_up)
        self._flight.submit([(i, step, None) for i in prompt_ids])
        return len(prompt_ids)

    def _resume_aborted(self, step: int, missing: int, budget: int, *, every: bool) -> None:
        """Continue carried aborted groups, oldest first, as many as a round would ask for ``missing`` groups (or
        ``every`` one); drop those too old to train on; the rest stay carried."""
        usable, stale = split_stale(self.carried_aborted, step, self.config.max_staleness_steps)
        for partial in stale:
            self.ledger.drop_aborted(partial, "stale")
        count = inflight_target(self.config, missing, self.keep_rate_estimate, budget, streaming=True) if missing else 0
        count = len(usable) if every else count
        resumed, self.carried_aborted = usable[:count], usable[count:]
        self.counters["resumed_groups"] += len(resumed)
        self.counters["resumed_tokens"] += sum(p.tokens for _, p in resumed)
        self._flight.submit([(p.prompt_id, born, p) for born, p in resumed])

    # -- collecting -----------------------------------------------------------------------------------

    def _place(
        self,
        completions: Sequence[Completion],
        batch: list[GroupResult],
        ages: list[tuple[int, int]],
        step: int,
        target: int,
    ) -> None:
        """Filter finished groups and place each in the batch, among the carried, or among the dropped."""
        if not completions:
            return
        groups = [g for _, g in completions]
        reasons = drop_reasons(groups)
        kept = 0
        for (request, group), reason in zip(completions, reasons):
            self.ledger.generated(group, request.prefix_tokens)
            informative = reason == DropReason.KEEP
            predicted = self.stream.record(
                group.prompt_id, reason, correct=successes(group.metric), group_size=group.group_size
            )
            if self.predictor is not None:
                self.ledger.prediction(predicted, informative)
            if not informative and self.config.enable:
                self.ledger.drop(group, reason.label)
                continue
            kept += 1
            self.counters["groups_kept"] += 1
            if len(batch) < target:
                batch.append(group)
                if request.born_step < step:  # a continued group: its prefix is older than this step
                    ages.append((step - request.born_step, request.prefix_tokens))
            elif self.config.surplus == SurplusPolicy.CARRY:
                self.carried.append((request.born_step, group))
            else:
                self.ledger.drop(group, "surplus")
        self.keep_rate_estimate = update_keep_rate(
            self.keep_rate_estimate,
            kept,
            len(groups),
            self.config.keep_rate_smoothing,
            round_size=self.config.train_batch_size,
        )

    def _abort_rest(self, batch: list[GroupResult], ages: list[tuple[int, int]], step: int, target: int) -> None:
        """The batch is full (or the step stopped short): abort what is still generating; place what finished meanwhile
        and carry (``surplus=carry``) or drop the unfinished groups."""
        aborted = self._flight.abort()
        self._place(aborted.finished, batch, ages, step, target)
        for request, partial in aborted.partial:
            self.ledger.aborted(request, partial)
            if self.config.surplus == SurplusPolicy.CARRY and self.engine.resumes_partials:
                self.carried_aborted.append((request.born_step, partial))
            else:
                self.ledger.drop_aborted(partial, "discarded")

    # -- carry, drop, shortfall ---------------------------------------------------------------------

    def _take_carried(self, step: int, target: int) -> tuple[list[GroupResult], list[tuple[int, int]]]:
        """Carried finished groups for the batch, oldest first, and (age, tokens) of each."""
        usable, stale = split_stale(self.carried, step, self.config.max_staleness_steps)
        for group in stale:
            self.ledger.drop(group, "stale")
        taken, self.carried = usable[:target], usable[target:]
        return [g for _, g in taken], [(step - born, g.num_tokens) for born, g in taken]

    def _shortfall(self, batch: list[GroupResult], step: int, before: tuple[dict, ...], *, limit: str) -> None:
        """The step stops short (``limit``): train on the batch (``partial``) or drop it and raise."""
        counters = {
            key: int(self.counters[key] - before[0][key])
            for key in ("groups_generated", "gen_rounds", "prompts_requested", "groups_kept")
        }
        message = shortfall_message(
            self.config,
            step=step,
            found=len(batch),
            limit=limit,
            counters=counters,
            keep_rate_estimate=self.keep_rate_estimate,
        )
        if self.config.on_shortfall == ShortfallPolicy.PARTIAL:  # the user chose this: dapo/sampler/partial says so
            logger.info("%s Training on the %d groups found.", message, len(batch))
            return
        for group in batch:
            self.ledger.drop(group, "shortfall")
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
            **self.ledger.state_dict(),
            "keep_rate_estimate": self.keep_rate_estimate,
            "stream": self.stream.state_dict(),
            "carried": encode_groups(self.carried, self.codec),
            "carried_aborted": encode_partials(self.carried_aborted, self.codec),
            "planned": None
            if self._planned is None
            else {"prompt_ids": list(self._planned[0]), "revisited": self._planned[1]},
            "trained_prompts": sorted(self._trained_prompts),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the prompt source must be the same size).

        Version 1 states (before measured skipping) are read too: everything is restored except the prompt
        histories, which start afresh because version 1 did not record a streak's kind; version 2 states hold no
        aborted groups. The state is checked first, and a load that fails leaves the sampler as it was.

        Raises:
            TypeError, ValueError: naming what is wrong with ``state``.
        """
        check_state(state, _READABLE_VERSIONS)
        with restoring(self.state_dict, self._restore):
            self._restore(state)

    def _restore(self, state: dict[str, Any]) -> None:
        self.ledger.load_state_dict(state)
        self.keep_rate_estimate = state["keep_rate_estimate"]
        self.stream.load_state_dict(state["stream"])
        self.carried = decode_groups(state["carried"], self.codec)
        self.carried_aborted = decode_partials(state.get("carried_aborted", []), self.codec)  # absent before version 3
        planned = state.get("planned")  # absent in states written before plan_next_round existed
        self._planned = (
            None if planned is None else ([int(i) for i in planned["prompt_ids"]], int(planned["revisited"]))
        )
        self._trained_prompts = {int(i) for i in state.get("trained_prompts", [])}  # absent before coverage was kept


# -- the step's metrics (module docstring) ------------------------------------------------------------------

PREFIX = "dapo/sampler/"


def _ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, or 0 when nothing was counted."""
    return numerator / denominator if denominator else 0.0


def _or_minus_one(value: float | None) -> float:
    """A measured rate for a metric: -1 while it is unknown."""
    return -1.0 if value is None else value


def step_metrics(
    sampler: BatchReplenisher,
    before: tuple[dict, ...],
    trained: int,
    from_carry: int,
    ages: list[tuple[int, int]],
    *,
    partial: bool,
    inflight_at_full: int = 0,
) -> dict[str, float]:
    """The step's metrics (module docstring), keyed ``dapo/sampler/<name>``.

    Args:
        sampler: The replenisher, as the step ends.
        before: Its counters and drop counts as the step began.
        trained: Groups in the step's batch.
        from_carry: Of those, groups carried from earlier steps (they come first).
        ages: (steps since generated, tokens) of the batch's tokens generated before this step: the carried groups'
            first, in order, then the prefixes of continued groups.
        partial: Whether the batch is short.
        inflight_at_full: Groups still generating when the batch filled.
    """
    c0, d0, a0 = before
    delta = {k: sampler.counters[k] - c0[k] for k in sampler.counters}
    dropped = {f"dropped/{k}": float(count - d0[k]) for k, count in sampler.dropped.items()}  # every reason, in order
    dropped_aborted = {
        f"dropped_aborted/{k}": float(count - a0[k]) for k, count in sampler.ledger.dropped_aborted.items()
    }
    staleness = [age for age, _ in ages[:from_carry]]
    trained_tokens = delta["response_tokens_trained"]
    generated = delta["groups_generated"]
    stream = sampler.stream
    metrics = {
        "train_step": sampler.counters["train_steps"],
        "gen_rounds": delta["gen_rounds"],
        "prompts_requested": delta["prompts_requested"],
        "prompts_skipped": float(stream.prompts_skipped),
        "prompts_revisited": delta["prompts_revisited"],
        "prompts_consumed": float(stream.prompts_consumed),
        "data_epoch": float(stream.epoch),
        "groups_generated": generated,
        "groups_trained": float(trained),
        "groups_from_carry": float(from_carry),
        "keep_rate": _ratio(delta["groups_kept"], generated),
        "keep_rate_estimate": sampler.keep_rate_estimate if sampler.keep_rate_estimate is not None else 0.0,
        "prefilter_acc": _ratio(delta["metric_sum"], delta["responses_generated"]),
        "prefilter_score": _ratio(delta["score_sum"], delta["score_count"]),
        "responses_generated": delta["responses_generated"],
        "responses_trained": delta["responses_trained"],
        "generated_per_trained": _ratio(delta["responses_generated"], delta["responses_trained"]),
        "wasted_response_tokens": delta["wasted_response_tokens"],
        "truncated_fraction": _ratio(delta["truncated_responses"], delta["responses_generated"]),
        "carried_groups": float(len(sampler.carried)),
        "carried_staleness_mean": _ratio(sum(staleness), len(staleness)),
        "carried_staleness_max": float(max(staleness, default=0)),
        "response_tokens_generated": delta["response_tokens_generated"],
        "response_tokens_trained": trained_tokens,
        "tokens_generated_per_trained": _ratio(delta["response_tokens_generated"], trained_tokens),
        "aborted_groups": delta["aborted_groups"],
        "aborted_responses": delta["aborted_responses"],
        "aborted_tokens": delta["aborted_tokens"],
        "resumed_groups": delta["resumed_groups"],
        "resumed_tokens": delta["resumed_tokens"],
        "carried_aborted_groups": float(len(sampler.carried_aborted)),
        "inflight_at_full": float(inflight_at_full),
        "trained_token_age_mean": _ratio(delta["old_token_steps"], trained_tokens),
        "trained_token_age_max": float(max((age for age, tokens in ages if tokens), default=0)),
        "partial": float(partial),
        "history_size": float(stream.history_size),
        **_prediction_metrics(sampler.predictor, delta),
        **_pool_metrics(sampler),
        **dropped,
        **dropped_aborted,
    }
    return {PREFIX + k: float(v) for k, v in metrics.items()}


def _prediction_metrics(predictor: SuccessPredictor | None, delta: dict[str, float]) -> dict[str, float]:
    """How well this step's predictions matched what came back (none without a predictor)."""
    if predictor is None:
        return {}
    count = delta["predicted_groups"]
    others, after_informative = predictor.calibration_factors()
    return {
        "predicted_keep_rate": delta["predicted_sum"] / count if count else -1.0,
        "prediction_brier": delta["prediction_squared_error"] / count if count else -1.0,
        "prediction_calibration": _or_minus_one(predictor.calibration),
        "calibration_after_informative": after_informative,
        "calibration_others": others,
        "predictor_size": float(predictor.size),
    }


def _pool_metrics(sampler: BatchReplenisher) -> dict[str, float]:
    """The prompt pool: exhaustion, coverage and the measured informative rates of the streak buckets."""
    history = sampler.stream.history
    no_streak, streak = history.streak_rates()
    return {
        "pool_exhausted_fraction": history.exhausted_fraction,
        "pool_solved_fraction": history.solved_fraction,
        "pool_failed_fraction": history.failed_fraction,
        "pool_exhausted": float(sampler.pool_exhausted),
        "pool_trained_fraction": sampler.trained_prompts / sampler.stream.num_prompts,
        "keep_rate_no_streak": _or_minus_one(no_streak),
        "keep_rate_streak": _or_minus_one(streak),
        "keep_rate_stream": _or_minus_one(history.stream_rate()),
        "keep_rate_revisit": _or_minus_one(history.revisit_rate()),
        "revisits_waiting": float(sampler.stream.revisits_waiting),
    }
