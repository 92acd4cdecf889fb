"""What each prompt's past groups say about its next one: streaks, measured rates, skipping, pool exhaustion.

A prompt's *streak* counts its latest groups in a row that were uninformative, with a sign for the kind:
``+k`` after k all-correct groups, ``-k`` after k all-wrong (or zero-spread) groups, 0 when it was never
generated or its last group was informative. Skipped prompts keep their streak: only a generated group
changes it.

Measured skipping (the idea of GRESO, arXiv 2506.02177, with its rule replaced by a measurement). Prompts
fall into buckets by streak (``-4 .. +4``; longer streaks share the end buckets) and the history keeps, per
bucket, the informative rate of the groups generated from it (an average over about as many groups as the
keep-rate estimate, so it follows a changing policy). A prompt in bucket ``b != 0`` is generated with
probability

    g_b = min(1, max(1 - max_skip_probability, rate_b / rate_0))

where ``rate_0`` is the rate of prompts without a streak. A bucket is thinned in proportion to how much
less informative the data show it to be, so the generated mix shifts towards informative prompts; where
history predicts nothing (``rate_b ~ rate_0``) nothing is skipped. Each rate starts from ``rate_0`` with the
weight of :data:`PRIOR_GROUPS` groups, so a bucket is only thinned on evidence, and ``1 -
max_skip_probability`` keeps every prompt a chance at every visit, so none is skipped for good and a
prompt the policy has started to get wrong again is found.

Revisits. When informative groups become rare, they concentrate on few prompts: in the default local run,
once the policy has learned the task, a prompt whose group was just informative is informative again about
30 times as often as a fresh one (17% against 0.5%). The history therefore also measures the rate of
*revisited* prompts (re-asked, by :class:`~dapo_verl.sampler.stream.PromptStream`, in a later step because
their last group was informative) in its own bucket, and the rate of every other generated group (the
*stream* rate). :func:`revisits_pay` opens revisits only while the stream rate is below the floor the
adaptive sizing trusts (``1 / max_oversample_factor``: informative groups are rare) and revisits are not
measured to be less informative than the stream, so they never narrow the data while groups are plentiful.

Pool exhaustion: a prompt is *exhausted* when ``|streak| >= exhausted_streak`` (solved, or failed, that
many times in a row). The share of the whole prompt pool that is exhausted is the signal that the data
has little left to teach; never-generated prompts count as not exhausted.
"""

from __future__ import annotations

from typing import Any

from dapo_verl.core import DropReason
from dapo_verl.sampler.arguments import require_int, require_real
from dapo_verl.sampler.state_parts import read_amounts, read_count, read_rows, state_mapping

__all__ = ["PRIOR_GROUPS", "STREAK_LEVELS", "PromptHistory", "generate_probability", "next_streak", "revisits_pay"]

STREAK_LEVELS = 4
"""Streaks of this length or longer share a bucket (one for all-correct, one for all-wrong)."""

PRIOR_GROUPS = 8.0
"""Weight, in groups, of the no-streak rate that every bucket's rate starts from."""


def next_streak(streak: int, reason: DropReason) -> int:
    """A prompt's streak after one more generated group (see the module docstring for the sign)."""
    if reason == DropReason.KEEP:
        return 0
    if reason == DropReason.ALL_CORRECT:
        return streak + 1 if streak > 0 else 1
    return streak - 1 if streak < 0 else -1


def generate_probability(bucket_rate: float | None, no_streak_rate: float | None, max_skip_probability: float) -> float:
    """Probability of generating a prompt whose bucket has ``bucket_rate`` (the rule of the module docstring).

    Args:
        bucket_rate: Measured informative rate of the prompt's streak bucket (prior included).
        no_streak_rate: Measured informative rate of prompts without a streak; None before any was seen.
        max_skip_probability: Cap on skipping; ``1 - max_skip_probability`` is the floor of the result.

    Returns:
        A probability in ``[1 - max_skip_probability, 1]``; 1 without a measured no-streak rate above 0.
    """
    if bucket_rate is None or not no_streak_rate:
        return 1.0
    return min(1.0, max(1.0 - max_skip_probability, bucket_rate / no_streak_rate))


def revisits_pay(stream_rate: float | None, revisit_rate: float | None, floor: float) -> bool:
    """Whether re-asking recently informative prompts is worth it now.

    Args:
        stream_rate: Measured informative rate of the groups drawn from the prompt stream (None: unknown).
        revisit_rate: Measured informative rate of revisited prompts; None until :data:`PRIOR_GROUPS` were seen.
        floor: Keep rate below which informative groups count as rare (``1 / max_oversample_factor``).

    Returns:
        True while the stream rate is below ``floor`` and revisits are not measured to be less informative.
    """
    if stream_rate is None or stream_rate >= floor:
        return False
    return revisit_rate is None or revisit_rate > stream_rate


def check_record(
    prompt_id: object, reason: object, num_prompts: int, correct: object = None, group_size: object = None
) -> None:
    """Raise unless a group's record fits: ``prompt_id`` in ``range(num_prompts)``, ``reason`` a DropReason, and
    (when given) ``group_size`` an integer >= 2 with ``correct`` in [0, group_size]."""
    require_int(
        "prompt_id",
        prompt_id,
        low=0,
        high=num_prompts - 1,
        fix="Pass the prompt's index in the prompt source (the ids the sampler handed out).",
    )
    if not isinstance(reason, DropReason):
        raise TypeError(
            f"reason={reason!r} must be a dapo_verl.core.DropReason (the group filter's verdict); take "
            f"it from group_drop_reasons."
        )
    if group_size is not None:
        size = require_int("group_size", group_size, low=2, fix="Pass G, the responses generated for the prompt.")
        if correct is not None:
            require_int(
                "correct", correct, low=0, high=size, fix=f"Pass how many of the group's {size} responses were right."
            )


class PromptHistory:
    """Per-prompt streaks and the informative rate measured per streak bucket (see the module docstring).

    Args:
        num_prompts: Size of the prompt pool (the denominator of the pool shares; an integer >= 1).
        smoothing_groups: Groups each bucket's rate averages over (its effective sample size; finite, >= 1).
        max_skip_probability: Cap on any prompt's skip probability, in [0, 1).
        exhausted_streak: Streak length from which a prompt counts as exhausted (an integer >= 1).

    Raises:
        TypeError, ValueError: naming an argument that is not of its type or out of its range.
    """

    def __init__(
        self, num_prompts: int, *, smoothing_groups: float, max_skip_probability: float, exhausted_streak: int
    ) -> None:
        self.num_prompts = require_int(
            "num_prompts", num_prompts, low=1, fix="Pass the number of prompts in the training data."
        )
        self.max_skip_probability = require_real(
            "max_skip_probability",
            max_skip_probability,
            low=0.0,
            high=1.0,
            high_open=True,
            fix="1 would skip prompts for good; use e.g. 0.9 (algorithm.filter_groups.max_skip_probability).",
        )
        self.exhausted_streak = require_int(
            "exhausted_streak", exhausted_streak, low=1, fix="Use e.g. 3 (algorithm.filter_groups.exhausted_streak)."
        )
        smoothing_groups = require_real(
            "smoothing_groups", smoothing_groups, low=1.0, fix="The sampler passes estimate_sample_size(config)."
        )
        self._decay = 1.0 - 1.0 / smoothing_groups
        self._streak: dict[int, int] = {}
        size = 2 * STREAK_LEVELS + 2  # streak buckets, then the revisit bucket
        self._generated = [0.0] * size  # decayed counts per bucket, index streak + STREAK_LEVELS
        self._informative = [0.0] * size
        self._stream = [0.0, 0.0]  # decayed (generated, informative) of every group that was not a revisit
        self._solved = 0  # prompts with streak >= exhausted_streak
        self._failed = 0  # prompts with streak <= -exhausted_streak

    # -- per prompt ----------------------------------------------------------------------------------

    def streak(self, prompt_id: int) -> int:
        """The prompt's signed streak (0 without one)."""
        return self._streak.get(prompt_id, 0)

    REVISIT = 2 * STREAK_LEVELS + 1
    """Index of the revisit bucket."""

    @staticmethod
    def bucket(streak: int) -> int:
        """Bucket index of a streak: ``clamp(streak, -STREAK_LEVELS, STREAK_LEVELS) + STREAK_LEVELS``."""
        return max(-STREAK_LEVELS, min(STREAK_LEVELS, streak)) + STREAK_LEVELS

    def record(self, prompt_id: int, reason: DropReason, *, revisit: bool = False) -> None:
        """Account one generated group of ``prompt_id``: its bucket's rate (the revisit bucket for a revisited
        prompt, else its streak's), the stream rate, then its streak.

        Raises:
            TypeError, ValueError: for a prompt id outside ``range(num_prompts)`` or a reason that is not a
                :class:`~dapo_verl.core.DropReason`.
        """
        check_record(prompt_id, reason, self.num_prompts)
        old = self._streak.get(prompt_id, 0)
        b = self.REVISIT if revisit else self.bucket(old)
        informative = float(reason == DropReason.KEEP)
        self._generated[b] = self._decay * self._generated[b] + 1.0
        self._informative[b] = self._decay * self._informative[b] + informative
        if not revisit:
            self._stream = [self._decay * self._stream[0] + 1.0, self._decay * self._stream[1] + informative]
        new = next_streak(old, reason)
        self._count_exhausted(old, -1)
        self._count_exhausted(new, +1)
        if new:
            self._streak[prompt_id] = new
        else:
            self._streak.pop(prompt_id, None)

    def _count_exhausted(self, streak: int, sign: int) -> None:
        if streak >= self.exhausted_streak:
            self._solved += sign
        elif streak <= -self.exhausted_streak:
            self._failed += sign

    def generate_probability(self, prompt_id: int) -> float:
        """Probability that a visit to ``prompt_id`` generates it (1 for prompts without a streak)."""
        streak = self._streak.get(prompt_id, 0)
        if streak == 0:
            return 1.0
        return generate_probability(
            self.rate(self.bucket(streak)), self.rate(self.bucket(0)), self.max_skip_probability
        )

    # -- measurements --------------------------------------------------------------------------------

    def rate(self, bucket: int) -> float | None:
        """Measured informative rate of a bucket; other buckets start from the no-streak rate (None: unknown)."""
        zero = self.bucket(0)
        base = self._informative[zero] / self._generated[zero] if self._generated[zero] else None
        if bucket == zero:
            return base
        if base is None:
            return None
        return (self._informative[bucket] + PRIOR_GROUPS * base) / (self._generated[bucket] + PRIOR_GROUPS)

    def streak_rates(self) -> tuple[float | None, float | None]:
        """Measured informative rate of prompts without a streak and (pooled) of prompts with one."""
        zero = self.bucket(0)
        streaks = [b for b in range(self.REVISIT) if b != zero]
        generated = sum(self._generated[b] for b in streaks)
        informative = sum(self._informative[b] for b in streaks)
        return self.rate(zero), (informative / generated if generated else None)

    def stream_rate(self) -> float | None:
        """Measured informative rate of every generated group that was not a revisit (None before any)."""
        return self._stream[1] / self._stream[0] if self._stream[0] else None

    def revisit_rate(self) -> float | None:
        """Measured informative rate of revisited prompts; None until :data:`PRIOR_GROUPS` revisits were seen."""
        generated = self._generated[self.REVISIT]
        return self._informative[self.REVISIT] / generated if generated > PRIOR_GROUPS - 1 else None  # decayed count

    def revisits_pay(self, floor: float) -> bool:
        """:func:`revisits_pay` on the measured rates."""
        return revisits_pay(self.stream_rate(), self.revisit_rate(), floor)

    @property
    def size(self) -> int:
        """Prompts currently holding a streak (at most ``num_prompts``)."""
        return len(self._streak)

    @property
    def solved_fraction(self) -> float:
        """Share of the pool whose last ``exhausted_streak`` groups were all correct."""
        return self._solved / self.num_prompts

    @property
    def failed_fraction(self) -> float:
        """Share of the pool whose last ``exhausted_streak`` groups were all wrong."""
        return self._failed / self.num_prompts

    @property
    def exhausted_fraction(self) -> float:
        """Share of the pool that is exhausted (solved or failed ``exhausted_streak`` times in a row)."""
        return (self._solved + self._failed) / self.num_prompts

    # -- state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state: streaks (sorted by prompt id) and the per-bucket counts."""
        return {
            "streak": sorted([pid, k] for pid, k in self._streak.items()),
            "generated": list(self._generated),
            "informative": list(self._informative),
            "stream": list(self._stream),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; an empty dict restores an empty history, and a missing part starts empty.

        The exhausted counts are recomputed from the streaks.

        Raises:
            TypeError: for a state that is not a mapping.
            ValueError: naming a key that is not part of the state, or a part of the wrong type or range (a prompt
                outside the pool, negative counts, ...); the history is then unchanged.
        """
        owner, size = "PromptHistory", self.REVISIT + 1
        parts = state_mapping(owner, state, ("streak", "generated", "informative", "stream"))
        rows = read_rows(owner, "streak", parts.get("streak", []), 2)
        streak = {
            read_count(owner, "streak", pid, high=self.num_prompts - 1): read_count(owner, "streak", k, low=None)
            for pid, k in rows
        }
        generated = read_amounts(owner, "generated", parts.get("generated", [0.0] * size), size)
        informative = read_amounts(owner, "informative", parts.get("informative", [0.0] * size), size)
        stream = read_amounts(owner, "stream", parts.get("stream", [0.0, 0.0]), 2)
        self._streak = {pid: k for pid, k in streak.items() if k}  # a streak of 0 is kept as no entry
        self._generated, self._informative, self._stream = generated, informative, stream
        self._solved = sum(k >= self.exhausted_streak for k in self._streak.values())
        self._failed = sum(k <= -self.exhausted_streak for k in self._streak.values())
