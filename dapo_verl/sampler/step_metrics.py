"""What the batch replenisher reports for each training step: the ``dapo/sampler/*`` metrics.

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

from typing import Protocol

from dapo_verl.sampler.engine import PartialGroup
from dapo_verl.sampler.ledger import Ledger
from dapo_verl.sampler.prediction import SuccessPredictor
from dapo_verl.sampler.stream import PromptStream
from dapo_verl.sampler.types import GroupResult

__all__ = ["SamplerView", "step_metrics"]


class SamplerView(Protocol):
    """What the metrics read of the batch replenisher (:class:`~dapo_verl.sampler.BatchReplenisher` has it all)."""

    carried: list[tuple[int, GroupResult]]
    carried_aborted: list[tuple[int, PartialGroup]]
    keep_rate_estimate: float | None
    ledger: Ledger
    predictor: SuccessPredictor | None
    stream: PromptStream

    @property
    def counters(self) -> dict[str, float]: ...

    @property
    def dropped(self) -> dict[str, int]: ...

    @property
    def pool_exhausted(self) -> bool: ...

    @property
    def trained_prompts(self) -> int: ...


PREFIX = "dapo/sampler/"


def _ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, or 0 when nothing was counted."""
    return numerator / denominator if denominator else 0.0


def _or_minus_one(value: float | None) -> float:
    """A measured rate for a metric: -1 while it is unknown."""
    return -1.0 if value is None else value


def step_metrics(
    sampler: SamplerView,
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


def _pool_metrics(sampler: SamplerView) -> dict[str, float]:
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
