"""How many prompts to ask for in a generation round, and the keep-rate estimate that sizes it.

``barrier`` always asks for a fixed round (verl-recipe). ``adaptive`` treats each prompt as kept with the
running keep-rate estimate p and asks for the smallest n whose kept count K reaches the missing m groups
with probability ``single_round_probability`` under a normal approximation:

    n p - z sqrt(Var K) >= m,   z = Phi^-1(single_round_probability),
    Var K = n p (1 - p) + n^2 p (1 - p) / N_est,

where the first term is the binomial spread of this round and the second the error of the estimate p
itself, which averages about ``N_est = train_batch_size * (2 - s) / s`` groups (``s`` =
``keep_rate_smoothing``; the effective sample size of the moving average below). Without the second term
the sizing promises the probability for a known keep rate and misses it by a few points in practice.

The estimate is an exponential moving average over generated *groups*, not over rounds: a round of ``g``
groups weighs ``1 - (1 - s)**(g / train_batch_size)``, so a full round weighs ``s`` and a top-up round of a
few groups barely moves it (a per-round average let a 3-group round swing the estimate by 30%).

Bound: keep rates below ``1 / max_oversample_factor`` are treated as that floor, and no round asks for
more than a known keep rate at the floor would need -- about ``max_oversample_factor * m`` plus the
binomial margin (:func:`max_request_size`) -- so a collapsing estimate cannot explode a request, while a
one-group top-up still gets enough prompts to be likely to succeed.

Budget: a training step generates at most ``max_num_gen_batches * max(gen_batch_size, train_batch_size)``
prompts (:func:`step_prompt_budget`), whatever the strategy -- the most verl-recipe's round limit lets it
generate. Adaptive rounds share that budget (:func:`round_request`): when the keep rate collapses they
stop at the same cost as fixed rounds would instead of asking ``max_oversample_factor`` times more per
round, so a step's generation stays bounded by the user's two knobs even when almost no group is
informative.

Yield: adaptive refill never asks for more than the expected informative yield can repay. When even the
rest of the step's budget is expected to find fewer groups than are missing (``keep_rate * budget_left <
missing``, :func:`budget_can_fill`), a big round would only buy a partial batch at more than
``budget / train_batch_size`` prompts per group; the step's rounds are then ``gen_batch_size`` prompts (probes
that keep the keep-rate estimate and the prompt histories current, and feed revisits). Whether the step stops
after its first round (:func:`yield_stops`) depends on ``on_shortfall``. With ``partial`` it stops, but only once
the estimate rests on as many groups as it averages (``N_est``): before that it is mostly its first round's luck --
a 4-prompt step whose first round happened to hold no informative group (an estimate of 0 from 4 groups, where
``N_est`` is 23) keeps refilling. With ``error`` it never stops early: stopping would end the run, and the budget
is what the user agreed to spend before that. ``refill=barrier`` keeps verl-recipe's behaviour:
fixed rounds up to the round limit.

Predicted yield (``prompt_selection=predicted``): the prompts a round would take are known before it is
generated, each with its predicted chance q_i of an informative group (:mod:`~dapo_verl.sampler.prediction`),
so :func:`predicted_request` takes the shortest prefix of them whose kept count reaches the missing groups with
probability ``single_round_probability``:

    sum c q_i - z sqrt(sum c q_i (1 - c q_i) + (sum c q_i)^2 / N_est) >= m,

with c the predictor's calibration (observed over predicted informative groups) and the last term the error of
c itself, as above. Where the prompts taken are better than the average, the round is smaller than the keep rate
alone would ask for, and the margin that discard would throw away shrinks with it. A round does not dilute prompts
predicted above the scarcity floor ``1 / max_oversample_factor`` with prompts below it to reach the probability:
it stops at the first one below and the stream draws more candidates; only in the last window the stream may draw,
or when even the best candidate is below the floor (informative groups are scarce everywhere), does it take as
many as the probability needs. (Stopping at the floor in the last window too left the batch to later rounds: 1.3
rounds per step instead of 1.05 where informative prompts thin out, for no fewer responses.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import TYPE_CHECKING

from dapo_verl.config import RefillStrategy, SamplerConfig, ShortfallPolicy
from dapo_verl.sampler.arguments import require_flag, require_int, require_real
from dapo_verl.sampler.stream import RoundSize

if TYPE_CHECKING:
    from dapo_verl.sampler.prediction import SuccessPredictor

__all__ = [
    "budget_can_fill",
    "estimate_sample_size",
    "inflight_target",
    "max_request_size",
    "predicted_request",
    "predicted_round_size",
    "request_size",
    "round_request",
    "step_prompt_budget",
    "update_keep_rate",
    "yield_stops",
]


def _check(
    config: object, missing: object = None, keep_rate: object = None, budget_left: object = None, *, budget_low: int = 0
) -> None:
    """Raise, naming the argument, unless the sizing inputs given (not None) fit: a SamplerConfig, ``missing`` an
    integer >= 1, ``keep_rate`` in [0, 1], ``budget_left`` an integer >= ``budget_low``."""
    if not isinstance(config, SamplerConfig):
        raise TypeError(
            f"config is a {type(config).__name__}; it must be a dapo_verl.config.SamplerConfig. Build it "
            f"with SamplerConfig(...) or DapoConfig.from_verl(...).sampler."
        )
    if missing is not None:
        require_int("missing", missing, low=1, fix="Pass the groups still needed to fill the batch.")
    if keep_rate is not None:
        require_real(
            "keep_rate",
            keep_rate,
            low=0.0,
            high=1.0,
            fix="Pass the running share of groups kept, or None before the first round.",
        )
    if budget_left is not None:
        require_int("budget_left", budget_left, low=budget_low, fix="Pass the prompts the step may still generate.")


def _prompts_needed(missing: int, p: float, z: float, sample_size: float) -> float:
    """Smallest real n with ``n p - z sqrt(n p (1-p) (1 + n / sample_size)) = missing`` (inf if none)."""
    q = z * z * p * (1.0 - p)
    a = p * p - q / sample_size
    if a <= 0.0:
        return math.inf  # the estimate is too uncertain to promise the probability at any size
    b = 2.0 * p * missing + q
    root = math.sqrt(max(b * b - 4.0 * a * missing * missing, 0.0))
    return (b + math.copysign(root, z)) / (2.0 * a)  # z < 0 (probability < 0.5) takes the lower root, n p < m


def estimate_sample_size(config: SamplerConfig) -> float:
    """Groups the keep-rate estimate effectively averages: ``train_batch_size * (2 - s) / s``."""
    _check(config)
    s = config.keep_rate_smoothing
    return config.train_batch_size * (2.0 - s) / s


def max_request_size(config: SamplerConfig, missing: int) -> int:
    """The most prompts :func:`request_size` can return for ``missing`` groups, over every keep rate."""
    _check(config, missing)
    if not config.enable:
        return missing
    if config.refill == RefillStrategy.BARRIER:
        return config.prompts_per_round
    z = NormalDist().inv_cdf(config.single_round_probability)
    at_floor = _prompts_needed(missing, 1.0 / config.max_oversample_factor, z, math.inf)
    return max(config.prompts_per_round, missing, math.ceil(at_floor))


def request_size(config: SamplerConfig, missing: int, keep_rate: float | None) -> int:
    """Prompts to generate in the next round.

    Args:
        config: The sampler settings.
        missing: Groups still needed to fill the batch (>= 1).
        keep_rate: Running estimate of the share of groups kept, or None before the first round.

    Returns:
        A positive number of prompts, at most :func:`max_request_size`.

    Raises:
        TypeError, ValueError: naming an argument that is not of its type or out of its range.
    """
    _check(config, missing, keep_rate)
    if config.refill == RefillStrategy.BARRIER or keep_rate is None or not config.enable:
        return config.prompts_per_round if config.enable else missing
    z = NormalDist().inv_cdf(config.single_round_probability)
    floor = 1.0 / config.max_oversample_factor
    p = min(max(keep_rate, floor), 1.0)
    sample_size = estimate_sample_size(config) if z > 0 else math.inf  # the estimate's error is a safety margin
    wanted = _prompts_needed(missing, p, z, sample_size)
    cap = _prompts_needed(missing, floor, z, math.inf)
    return max(missing, math.ceil(min(wanted, cap)))


def predicted_request(
    config: SamplerConfig,
    missing: int,
    predictions: Sequence[float],
    calibration: float | None,
    *,
    stop_at_floor: bool = True,
) -> tuple[int, bool]:
    """The shortest prefix of ``predictions`` expected to fill ``missing`` groups in one round (module docstring).

    Args:
        config: The sampler settings (``single_round_probability``, the estimate's sample size).
        missing: Groups still needed (>= 1).
        predictions: Predicted chance of an informative group of each prompt the round would take, in order.
        calibration: Observed over predicted informative groups so far (None: 1).
        stop_at_floor: Stop at the first prediction below the scarcity floor (while more candidates can be drawn);
            False takes as many as the probability needs (the last window).

    Returns:
        (prefix length in [1, len(predictions)], whether it meets the probability). Short of it, the length is the
        prompts down to the scarcity floor (all of them when even the best is below it).

    Raises:
        TypeError, ValueError: naming an argument (a prediction by its index) that is not of its type or out of its
            range: ``missing`` an integer >= 1, each prediction a probability in [0, 1], ``calibration`` None or a
            finite number >= 0.
    """
    _check(config, missing)
    _check_predictions(predictions)
    if calibration is not None:
        require_real(
            "calibration", calibration, low=0.0, fix="Pass observed over predicted informative groups, or None for 1."
        )
    require_flag("stop_at_floor", stop_at_floor, fix="False takes as many prompts as the probability needs.")
    z = NormalDist().inv_cdf(config.single_round_probability)
    factor = 1.0 if calibration is None else calibration
    sample_size = estimate_sample_size(config) if z > 0 else math.inf
    floor = 1.0 / config.max_oversample_factor
    scarce = not stop_at_floor or not predictions or factor * predictions[0] < floor
    mean = spread = 0.0
    for count, predicted in enumerate(predictions, 1):
        q = min(1.0, max(0.0, factor * predicted))
        if q < floor and not scarce:
            return count - 1, False
        mean += q
        spread += q * (1.0 - q)
        if mean - z * math.sqrt(spread + mean * mean / sample_size) >= missing:
            return count, True
    return max(1, len(predictions)), False


def _check_predictions(predictions: object) -> None:
    """Raise unless ``predictions`` is a sequence of probabilities; one pass in C on the good path."""
    if not isinstance(predictions, Sequence) or isinstance(predictions, str):
        raise TypeError(
            f"predictions is a {type(predictions).__name__}; it must be a list of probabilities, one per "
            f"prompt the round would take, in order."
        )
    try:
        fits = not predictions or (
            min(predictions) >= 0.0 and max(predictions) <= 1.0 and math.isfinite(math.fsum(predictions))
        )
    except TypeError:
        fits = False
    if fits:
        return
    for index, value in enumerate(predictions):  # the error path: name the first offender
        require_real(
            f"predictions[{index}]",
            value,
            low=0.0,
            high=1.0,
            fix="Each prediction is a prompt's chance of an informative group, in [0, 1].",
        )


def predicted_round_size(
    config: SamplerConfig, predictor: SuccessPredictor | None, keep_rate: float | None, missing: int, budget_left: int
) -> RoundSize | None:
    """Sizes a round from the predicted yield of the prompts it takes (:func:`predicted_request`), within the bounds
    the keep rate sets, asking the prompt stream for more candidates while the best it drew fall short; None where
    the predictions do not size it (no predictor or no prediction yet, barrier rounds, or a probe round when the
    budget cannot be expected to fill the batch).

    Args:
        config: The sampler settings.
        predictor: The sampler's :class:`~dapo_verl.sampler.prediction.SuccessPredictor`, or None.
        keep_rate: The running keep-rate estimate, or None before the first round.
        missing: Groups still needed (>= 1).
        budget_left: Prompts the step may still generate (>= 0).
    """
    _check(config, missing, keep_rate, budget_left)
    if (
        predictor is None
        or predictor.group_size is None
        or keep_rate is None
        or config.refill == RefillStrategy.BARRIER
        or not budget_can_fill(config, missing, keep_rate, budget_left)
    ):
        return None
    cap = max(1, min(budget_left, max_request_size(config, missing)))

    def size(predictions: list[float], final: bool) -> int | None:  # predictions already calibrated
        count, met = predicted_request(config, missing, predictions, None, stop_at_floor=not final)
        return min(cap, count) if met or final else None

    return size


def step_prompt_budget(config: SamplerConfig) -> int:
    """Most prompts one training step may generate: ``max_num_gen_batches * max(gen_batch_size,
    train_batch_size)`` (one round of ``train_batch_size`` with the filter off)."""
    _check(config)
    if not config.enable:
        return config.train_batch_size
    return config.max_num_gen_batches * max(config.prompts_per_round, config.train_batch_size)


def budget_can_fill(config: SamplerConfig, missing: int, keep_rate: float | None, budget_left: int) -> bool:
    """Whether the rest of the step's budget is expected to fill the batch: ``keep_rate * budget_left >= missing``.

    Always True for ``refill=barrier`` (verl-recipe generates up to its round limit), with the filter off, and
    before the keep rate is known.
    """
    _check(config, missing, keep_rate, budget_left)
    if config.refill == RefillStrategy.BARRIER or not config.enable or keep_rate is None:
        return True
    return keep_rate * budget_left >= missing


def yield_stops(
    config: SamplerConfig, missing: int, keep_rate: float | None, budget_left: int, groups_seen: float
) -> bool:
    """Whether a step stops generating after its first round because the rest of its budget cannot be expected to
    fill the batch (module docstring): only with ``on_shortfall=partial`` and adaptive refill, only once the
    keep-rate estimate rests on as many groups as it averages (``groups_seen >= N_est``), and only when
    ``keep_rate * budget_left < missing``.
    """
    _check(config, missing, keep_rate, budget_left)
    require_real("groups_seen", groups_seen, low=0.0, fix="Pass the groups the keep-rate estimate has seen.")
    if (
        config.on_shortfall != ShortfallPolicy.PARTIAL
        or config.refill == RefillStrategy.BARRIER
        or not config.enable
        or keep_rate is None
        or groups_seen < estimate_sample_size(config)
    ):
        return False
    return not budget_can_fill(config, missing, keep_rate, budget_left)


def inflight_target(
    config: SamplerConfig, missing: int, keep_rate: float | None, budget_left: int, *, streaming: bool
) -> int:
    """Groups a step should have generating for ``missing`` groups: one round (:func:`round_request`), times
    ``stream_oversample`` on a streaming engine, within ``budget_left``."""
    size = round_request(config, missing, keep_rate, budget_left)
    require_flag("streaming", streaming, fix="True for an engine that reports groups as they finish.")
    return min(budget_left, math.ceil(config.stream_oversample * size)) if streaming else size


def round_request(config: SamplerConfig, missing: int, keep_rate: float | None, budget_left: int) -> int:
    """Prompts for the next round: :func:`request_size` cut to what is left of the step's budget, or one round of
    ``gen_batch_size`` when the rest of the budget cannot be expected to fill the batch (:func:`budget_can_fill`).

    Args:
        config: The sampler settings.
        missing: Groups still needed to fill the batch (>= 1).
        keep_rate: Running estimate of the share of groups kept, or None before the first round.
        budget_left: Prompts this step may still generate (>= 1; see :func:`step_prompt_budget`).

    Returns:
        Between 1 and ``budget_left`` prompts.

    Raises:
        TypeError, ValueError: naming an argument that is not of its type or out of its range.
    """
    _check(config, missing, keep_rate, budget_left, budget_low=1)
    if not budget_can_fill(config, missing, keep_rate, budget_left):
        return max(1, min(config.prompts_per_round, budget_left))
    return max(1, min(request_size(config, missing, keep_rate), budget_left))


def update_keep_rate(
    estimate: float | None, kept: int, generated: int, smoothing: float, *, round_size: int | None = None
) -> float | None:
    """Exponential moving average of the keep rate (None until a round has been seen).

    Args:
        estimate: The current estimate, or None.
        kept: Groups of this round that were informative.
        generated: Groups generated in this round.
        smoothing: Weight of a full round (``keep_rate_smoothing``).
        round_size: Groups that make a full round (the replenisher passes ``train_batch_size``); a round
            of ``generated`` groups then weighs ``1 - (1 - smoothing)**(generated / round_size)``. None
            weighs every round ``smoothing``, whatever its size.

    Raises:
        TypeError, ValueError: naming an argument that is not of its type or out of its range.
    """
    if estimate is not None:
        require_real("estimate", estimate, low=0.0, high=1.0, fix="Pass the current keep rate, or None.")
    generated = require_int("generated", generated, low=0, fix="Pass the groups generated in this round.")
    require_int("kept", kept, low=0, high=generated, fix=f"Pass how many of the {generated} groups were informative.")
    require_real(
        "smoothing",
        smoothing,
        low=0.0,
        high=1.0,
        low_open=True,
        fix="Pass algorithm.filter_groups.keep_rate_smoothing, in (0, 1].",
    )
    if round_size is not None:
        require_int("round_size", round_size, low=1, fix="Pass train_batch_size, or None.")
    if generated == 0:
        return estimate
    observed = kept / generated
    if estimate is None:
        return observed
    weight = smoothing if round_size is None else 1.0 - (1.0 - smoothing) ** (generated / round_size)
    return min(1.0, (1.0 - weight) * estimate + weight * observed)  # an average of rates: at most 1 but for rounding
