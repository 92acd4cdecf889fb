"""Predicting, before generating it, how likely a prompt's next group is to be informative.

Dynamic sampling (DAPO, arXiv 2503.14476, §3.2) trains only on groups whose G responses disagree, so every
group that comes back all correct or all wrong is generation spent for nothing. This module predicts that
outcome per prompt from every group the prompt produced, so the sampler can choose prompts by their predicted
chance of an informative group and size a round from the predicted yield of the prompts it picked.

Model. A response to prompt i is correct with an unknown rate p_i; its groups are Binomial(G, p_i) draws.
The belief about p_i is Beta(alpha_i, beta_i):

    alpha_i = a0 + w_i * s_i,    beta_i = b0 + w_i * f_i,    w_i = 2 ** (-(t - t_i) / half_life_steps)

where s_i and f_i are the prompt's correct and wrong responses (each older observation already discounted the
same way when a newer one was added), t_i the training step of its latest group and t the current step.
Forgetting by *training steps* rather than by visits lets the estimate follow the policy as it learns: a prompt
last seen 30 steps ago says little about the policy of today, however often it was seen before that.

The population prior Beta(a0, b0) describes a prompt never seen (and is what an old estimate decays to). It is
fitted by moments to the recent groups of every prompt: with x = k / G the fraction of a group that is
correct, E[x] = m and Var[x] = m (1 - m) / G + (1 - 1 / G) Var[p], so Var[p] and the concentration
``c = m (1 - m) / Var[p] - 1`` follow; a0 = m c, b0 = (1 - m) c, with c clamped to
[:data:`MIN_CONCENTRATION`, :data:`MAX_CONCENTRATION`]. The moments are moving averages over about
``smoothing_groups`` groups, so the prior follows the policy too.

A group is informative when 0 < k < G. Its probability under the belief is exact:

    q_i = 1 - E[p^G] - E[(1 - p)^G],   E[p^G] = B(alpha + G, beta) / B(alpha, beta)

(computed with log-gamma functions), which weighs both the estimate and its uncertainty: a prompt seen once
with 8 of 8 correct is not certain to be solved, and its q says how likely it is to fail once in 8.

Calibration, measured separately where training may have changed the prompt. Training on a prompt changes it:
in real training a prompt whose group was just informative -- and so was trained on -- is often solved at its
next visit, which its own history cannot foresee; in a simulation where training changes nothing it stays as
informative as it was. Neither is assumed. The predictor keeps moving sums of the predicted q and of the
informative groups that came back in two buckets -- prompts whose last group was informative, and all others
(prompts never seen among them) -- and each bucket's factor ``c_b = (observed + K) / (predicted + K)``
(:data:`CALIBRATION_PRIOR_GROUPS` = K keeps it at 1 until measured) multiplies its predictions:
``score_i = min(1, c_b q_i)``. The scores rank candidates and size rounds, so where training is measured to
solve what it trains on, recently trained prompts lose their rank to fresh ones and the training data stays
spread over the pool; where it is not, they keep it. The sampler logs both factors and the mean score against
the observed informative rate every step.

What ranking may concentrate on. Ranking by the scores alone prefers prompts known to be informative over
fresh ones, and so trains on fewer distinct prompts: cheaper wherever prompts stay informative (a simulation in
which training does not change them), but in the local backend's real runs it trained on 0.10 of the pool where
measured skipping reaches 0.17, cost more responses per trained one and lost 0.10 held-out accuracy (59 seeds,
benchmarks/README.md). Unless ``prefer_informative`` is set, every ranking key is therefore capped at a fresh
prompt's score: the predictions pass over prompts expected to be *less* informative than a fresh one (solved,
failed) and never prefer the others over fresh ones, which keep the data's order among themselves.

Departures and limits: the success of a response is ``metric == 1`` (the filter metric is raw correctness,
``acc``, in 0/1, -1/1 or bool); for a non-binary metric the Beta-Bernoulli model is an approximation. Prompts
are independent: nothing is learned about a prompt from other prompts except through the population prior.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from dapo_verl.sampler.arguments import require_flag, require_int, require_real
from dapo_verl.sampler.prediction_state import read_predictor_state

__all__ = [
    "CALIBRATION_PRIOR_GROUPS",
    "MAX_CONCENTRATION",
    "MIN_CONCENTRATION",
    "SuccessPredictor",
    "beta_prior_from_moments",
    "informative_probability",
    "successes",
]

CALIBRATION_PRIOR_GROUPS = 8.0
"""Weight, in groups, of the factor 1 that each calibration bucket starts from."""

MIN_CONCENTRATION = 0.1
"""Smallest prior concentration a0 + b0: a population split between solved and failed prompts (U-shaped)."""

MAX_CONCENTRATION = 100.0
"""Largest prior concentration: even a population of identical prompts leaves one prompt's own groups a say."""


def informative_probability(alpha: float, beta: float, group_size: int) -> float:
    """Probability that a group of ``group_size`` responses is mixed when p ~ Beta(alpha, beta).

    ``1 - E[p^G] - E[(1 - p)^G]`` (module docstring). A parameter of 0 is the limit of the Beta distribution as it
    goes to 0: ``alpha = 0`` puts all belief on p = 0 (every response wrong), ``beta = 0`` on p = 1 (every response
    right); either way no group is mixed and the result is 0. Beta(0, 0) is no distribution and is refused.

    Args:
        alpha: Beta parameter of the correct responses (finite, >= 0).
        beta: Beta parameter of the wrong responses (finite, >= 0; not both 0).
        group_size: G, responses per prompt (an integer >= 2).

    Returns:
        A probability in [0, 1].

    Raises:
        TypeError: for a parameter that is not a real number, or a group size that is not an integer.
        ValueError: for a negative or non-finite parameter, both parameters 0, or a group size below 2.

    Example:
        >>> round(informative_probability(1.0, 1.0, 2), 4)  # p uniform: P(one right, one wrong) = 1/3
        0.3333
        >>> informative_probability(1e6, 1.0, 8) < 1e-4  # almost surely solved
        True
        >>> informative_probability(0.0, 3.0, 8)  # all belief on p = 0: never mixed
        0.0
    """
    fix = "Pass the Beta(alpha, beta) belief about the prompt's correct rate, e.g. (1.0, 1.0) for a uniform one."
    alpha = require_real("alpha", alpha, low=0.0, fix=fix)
    beta = require_real("beta", beta, low=0.0, fix=fix)
    group_size = require_int("group_size", group_size, low=2, fix="Pass G, the responses generated per prompt.")
    if alpha == 0.0 and beta == 0.0:
        raise ValueError(
            f"alpha=0.0 and beta=0.0: Beta(0, 0) is not a distribution, so no chance follows from it. {fix}"
        )
    if alpha == 0.0 or beta == 0.0:
        return 0.0
    return _informative(alpha, beta, group_size)


def _informative(alpha: float, beta: float, group_size: int) -> float:
    """:func:`informative_probability` without its checks (alpha, beta > 0 and G >= 2 known), for the predictor's
    per-candidate calls."""
    total = math.lgamma(alpha + beta) - math.lgamma(alpha + beta + group_size)
    all_correct = math.exp(math.lgamma(alpha + group_size) - math.lgamma(alpha) + total)
    all_wrong = math.exp(math.lgamma(beta + group_size) - math.lgamma(beta) + total)
    return min(1.0, max(0.0, 1.0 - all_correct - all_wrong))


def beta_prior_from_moments(mean: float, second_moment: float, group_size: int) -> tuple[float, float]:
    """The population prior Beta(a0, b0) from the first two moments of the groups' correct fraction k / G.

    Args:
        mean: Average correct fraction of recent groups, in [0, 1].
        second_moment: Average squared correct fraction, in [0, 1] (about [mean**2, mean]; a rounding error outside
            that only changes the fitted spread, which is clamped at 0).
        group_size: G of those groups (an integer >= 2).

    Returns:
        (a0, b0), with a0 + b0 in [MIN_CONCENTRATION, MAX_CONCENTRATION] (module docstring).

    Raises:
        TypeError, ValueError: for a moment that is not a finite number in [0, 1], or a group size that is not an
            integer >= 2.
    """
    fix = "Pass the averages of k / G and (k / G)**2 over recent groups, each in [0, 1]."
    mean = require_real("mean", mean, low=0.0, high=1.0, fix=fix)
    second_moment = require_real("second_moment", second_moment, low=0.0, high=1.0, fix=fix)
    group_size = require_int("group_size", group_size, low=2, fix="Pass G, the responses generated per prompt.")
    return _prior_from_moments(mean, second_moment, group_size)


def _prior_from_moments(mean: float, second_moment: float, group_size: int) -> tuple[float, float]:
    m = min(max(mean, 1e-4), 1.0 - 1e-4)
    spread = max(second_moment - mean * mean, 0.0)  # Var[x]
    between = (spread - m * (1.0 - m) / group_size) / (1.0 - 1.0 / group_size)  # Var[p]
    concentration = m * (1.0 - m) / between - 1.0 if between > 0 else MAX_CONCENTRATION
    concentration = min(max(concentration, MIN_CONCENTRATION), MAX_CONCENTRATION)
    return m * concentration, (1.0 - m) * concentration


def successes(metric: Tensor) -> int:
    """Correct responses of a group: those whose filter metric equals 1 (0/1, -1/1 and bool encodings).

    Raises:
        TypeError: for a metric that is not a tensor, or is complex.
        ValueError: for a meta tensor (it has no values to count).
    """
    if not isinstance(metric, Tensor):
        raise TypeError(
            f"metric is a {type(metric).__name__}; it must be a (G,) tensor of the group's filter metric. "
            f"Convert it with torch.as_tensor(...)."
        )
    if metric.is_meta or metric.is_complex():
        kind = "a meta tensor (no data)" if metric.is_meta else f"of dtype {metric.dtype}"
        raise (ValueError if metric.is_meta else TypeError)(
            f"metric is {kind}; its correct responses are counted, so a materialized tensor of real values is "
            f"expected. Pass the group's filter metric as computed on CPU or GPU."
        )
    return int((metric.detach().to("cpu").double() == 1.0).sum())


class SuccessPredictor:
    """Per-prompt Beta beliefs about the correct rate, forgotten by training steps, over a fitted population prior.

    Args:
        half_life_steps: Training steps after which a prompt's own groups weigh half as much (finite, > 0).
        smoothing_groups: Groups the population prior's moments and the calibration average over (finite, >= 1).
        prefer_informative: Rank prompts predicted more informative than a fresh one above fresh ones (concentrates
            training on fewer prompts); False caps every ranking key at a fresh prompt's (module docstring).

    The training step is set by the owner (:attr:`step`) before predictions and records.

    Raises:
        TypeError, ValueError: naming an argument that is not of its type or out of its range.
    """

    def __init__(self, *, half_life_steps: float, smoothing_groups: float, prefer_informative: bool = False) -> None:
        self.half_life_steps = require_real(
            "half_life_steps",
            half_life_steps,
            low=0.0,
            low_open=True,
            fix="It is the training steps after which a prompt's old groups weigh half; use e.g. 10 "
            "(algorithm.filter_groups.prediction_half_life_steps).",
        )
        smoothing_groups = require_real(
            "smoothing_groups",
            smoothing_groups,
            low=1.0,
            fix="It is the number of groups the prior and calibration average over; the sampler passes "
            "estimate_sample_size(config).",
        )
        self.prefer_informative = require_flag(
            "prefer_informative", prefer_informative, fix="Set algorithm.filter_groups.prefer_informative."
        )
        self._decay = 1.0 - 1.0 / smoothing_groups
        self.step = 0
        self.group_size: int | None = None  # G of the latest group; predictions need it
        # prompt id -> (correct, wrong, step of its last group, whether that group was informative)
        self._prompts: dict[int, tuple[float, float, int, bool]] = {}
        self._moments = [0.0, 0.0, 0.0]  # decayed (groups, sum of k/G, sum of (k/G)^2) over every group
        self._calibration = [[0.0, 0.0], [0.0, 0.0]]  # per bucket (other, after informative): decayed (q, informative)
        self._taken: dict[int, tuple[int, float]] = {}  # prompts taken, until recorded -> (bucket, q when taken)

    # -- predictions -------------------------------------------------------------------------------------

    def prior(self) -> tuple[float, float]:
        """The population prior (a0, b0); Beta(1, 1) before any group was recorded."""
        groups, first, second = self._moments
        if not groups or self.group_size is None:
            return 1.0, 1.0
        return _prior_from_moments(first / groups, second / groups, self.group_size)

    def belief(self, prompt_id: int, prior: tuple[float, float] | None = None) -> tuple[float, float]:
        """The prompt's Beta(alpha, beta) at the current step (the prior for a prompt never seen; ``prior``: the
        population prior when the caller has it already)."""
        a0, b0 = prior or self.prior()
        seen = self._prompts.get(prompt_id)
        if seen is None:
            return a0, b0
        correct, wrong, step, _ = seen
        weight = self._weight(step)
        return a0 + weight * correct, b0 + weight * wrong

    def informative(self, prompt_id: int) -> float:
        """Predicted probability that the prompt's next group is informative (module docstring); 1 before the
        first group (nothing is known yet, and G is not)."""
        if self.group_size is None:
            return 1.0
        return _informative(*self.belief(prompt_id), self.group_size)

    def informative_many(self, prompt_ids: Sequence[int]) -> list[float]:
        """:meth:`informative` of each prompt, the prior computed once."""
        if self.group_size is None:
            return [1.0] * len(prompt_ids)
        size, prior = self.group_size, self.prior()
        fresh = _informative(*prior, size)
        return [_informative(*self.belief(pid, prior), size) if pid in self._prompts else fresh for pid in prompt_ids]

    def scores(self, prompt_ids: Sequence[int]) -> list[float]:
        """Calibrated predictions ``min(1, c_b q_i)`` (module docstring), for ranking and round sizing
        (:class:`~dapo_verl.sampler.stream.PromptScorer`); 1 before the first group."""
        factors = self.calibration_factors()
        predictions = self.informative_many(prompt_ids)
        return [min(1.0, factors[self._bucket(pid)] * q) for pid, q in zip(prompt_ids, predictions)]

    def rank_keys(self, prompt_ids: Sequence[int], generator: torch.Generator) -> list[float]:
        """Ranked selection's keys: the calibrated predictions, capped at a fresh prompt's unless
        ``prefer_informative`` (module docstring: what ranking may concentrate on). Exploration is the stream's
        ``explore_fraction``; ``generator`` is not drawn from. (Thompson draws were tried instead and ranked worse:
        with G >= 8 a draw from a wide belief lands among the informative rates most of the time.)"""
        keys = self.scores(prompt_ids)
        if self.prefer_informative or self.group_size is None:
            return keys
        fresh = min(1.0, self.calibration_factors()[0] * _informative(*self.prior(), self.group_size))
        return [min(key, fresh) for key in keys]

    def taken(self, prompt_ids: Sequence[int]) -> None:
        """Note the prompts a round takes with the model's prediction for each now, before their groups arrive: the
        calibration compares exactly these with the outcomes (:class:`~dapo_verl.sampler.stream.PromptScorer`)."""
        if self.group_size is None:
            return
        predictions = self.informative_many(prompt_ids)
        self._taken.update((pid, (self._bucket(pid), q)) for pid, q in zip(prompt_ids, predictions))

    def _bucket(self, prompt_id: int) -> int:
        """1 for a prompt whose last group was informative, else 0 (never seen included)."""
        seen = self._prompts.get(prompt_id)
        return int(seen is not None and seen[3])

    def calibration_factors(self) -> tuple[float, float]:
        """Each bucket's factor ``(observed + K) / (predicted + K)``: (others, after an informative group)."""
        k = CALIBRATION_PRIOR_GROUPS
        others, after = ((observed + k) / (predicted + k) for predicted, observed in self._calibration)
        return others, after

    def evidence(self, prompt_ids: Sequence[int]) -> list[float]:
        """Responses of each prompt still weighing in its belief (``w_i (s_i + f_i)``; 0 for a prompt never seen),
        so exploration looks at the least known prompts first (:class:`~dapo_verl.sampler.stream.PromptStream`)."""
        out = []
        for pid in prompt_ids:
            seen = self._prompts.get(pid)
            out.append(0.0 if seen is None else self._weight(seen[2]) * (seen[0] + seen[1]))
        return out

    @property
    def ready(self) -> bool:
        """Whether a group was recorded (G and the prior are known), so the scores are predictions."""
        return self.group_size is not None

    @property
    def calibration(self) -> float | None:
        """Observed informative groups over the model's predicted ones, among generated prompts, both buckets
        together (None before any); a diagnostic: the scores apply each bucket's own factor."""
        predicted = self._calibration[0][0] + self._calibration[1][0]
        observed = self._calibration[0][1] + self._calibration[1][1]
        return observed / predicted if predicted > 0 else None

    @property
    def size(self) -> int:
        """Prompts with a belief of their own."""
        return len(self._prompts)

    def _weight(self, step: int) -> float:
        return 0.5 ** (max(self.step - step, 0) / self.half_life_steps)

    # -- updates -----------------------------------------------------------------------------------------

    def record(self, prompt_id: int, correct: int, group_size: int) -> None:
        """Account one generated group: ``correct`` of ``group_size`` responses were right. If a round took the
        prompt, its calibration bucket (the one it was in then) compares the prediction :meth:`taken` noted with
        the outcome.

        Args:
            prompt_id: The prompt (an integer >= 0).
            correct: Correct responses in the group (an integer in [0, group_size]).
            group_size: G of the group (an integer >= 2: a group of one response is never informative).

        Raises:
            TypeError, ValueError: naming an argument that is not an integer or out of its range; nothing is recorded.
        """
        require_int("prompt_id", prompt_id, low=0, fix="Pass the prompt's index in the prompt source.")
        group_size = require_int(
            "group_size", group_size, low=2, fix="Pass G, the responses generated for the prompt (rollout.n >= 2)."
        )
        correct = require_int(
            "correct",
            correct,
            low=0,
            high=group_size,
            fix=f"Pass how many of the group's {group_size} responses were right.",
        )
        informative = 0 < correct < group_size
        noted = self._taken.pop(prompt_id, None)
        if noted is not None:
            bucket = self._calibration[noted[0]]
            bucket[0] = self._decay * bucket[0] + noted[1]
            bucket[1] = self._decay * bucket[1] + float(informative)
        self.group_size = group_size
        d = self._decay
        fraction = correct / group_size
        self._moments = [
            d * self._moments[0] + 1.0,
            d * self._moments[1] + fraction,
            d * self._moments[2] + fraction * fraction,
        ]
        seen = self._prompts.get(prompt_id)
        if seen is None:
            self._prompts[prompt_id] = (float(correct), float(group_size - correct), self.step, informative)
            return
        weight = self._weight(seen[2])
        self._prompts[prompt_id] = (
            weight * seen[0] + correct,
            weight * seen[1] + group_size - correct,
            self.step,
            informative,
        )

    # -- state -------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state: beliefs (sorted by prompt id), prior moments, calibration sums, G and the step."""
        return {
            "step": self.step,
            "group_size": self.group_size,
            "prompts": sorted([pid, c, w, s, i] for pid, (c, w, s, i) in self._prompts.items()),
            "moments": list(self._moments),
            "calibration": [list(bucket) for bucket in self._calibration],
            "taken": sorted([pid, b, q] for pid, (b, q) in self._taken.items()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; an empty dict restores an empty predictor, and a missing part starts empty.

        Raises:
            TypeError: for a state that is not a mapping.
            ValueError: naming a key that is not part of the state, or a part of the wrong type or range (negative
                counts, a group size below 2, a prediction outside [0, 1], ...); the predictor is then unchanged.
        """
        read = read_predictor_state(state, set(self.state_dict()))  # a subclass's own parts are known too
        self.step, self.group_size, self._prompts = read.step, read.group_size, read.prompts
        self._moments, self._calibration, self._taken = read.moments, read.calibration, read.taken
