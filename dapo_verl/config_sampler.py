"""The dynamic-sampling section of the DAPO config (``algorithm.filter_groups.*`` and the batch sizes it fills):
:class:`SamplerConfig` and its choices, re-exported by :mod:`dapo_verl.config`, the home of every default.

Defaults follow the paper (arXiv 2503.14476, §3.2) except for the three sampler behaviours that only change what
dynamic sampling spends (``refill``, ``skip_uninformative``, ``revisit_informative``; :mod:`dapo_verl.config`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from enum import StrEnum

from dapo_verl.config_fields import (
    MAX_SEED,
    config_error,
    key_of,
    require_bool,
    require_choice,
    require_number,
    verl_key,
)

__all__ = ["PromptSelection", "RefillStrategy", "SamplerConfig", "ShortfallPolicy", "SurplusPolicy"]


class RefillStrategy(StrEnum):
    """How the sampler sizes each generation request while it fills a batch.

    * ``barrier``: every round generates ``data.gen_batch_size`` prompts (the verl-recipe behaviour).
    * ``adaptive``: each round asks for enough prompts that, at the observed keep rate, one round
      fills the batch with probability ``single_round_probability``, capped by ``max_oversample_factor``.
    """

    BARRIER = "barrier"
    ADAPTIVE = "adaptive"


class SurplusPolicy(StrEnum):
    """What happens to informative groups beyond a full batch: ``discard`` them or ``carry`` them over."""

    DISCARD = "discard"
    CARRY = "carry"


class PromptSelection(StrEnum):
    """How the sampler chooses prompts when ``skip_uninformative`` is on.

    * ``streak`` (the default): pass over prompts after all-correct or all-wrong streaks, in proportion to the
      informative rate measured per streak length (:mod:`dapo_verl.sampler.history`).
    * ``predicted``: rank candidates by the predicted chance of an informative group (a per-prompt Beta belief
      over the correct rate, forgotten by training steps; :mod:`dapo_verl.sampler.prediction`) and size each round
      from the predicted yield of the prompts taken.
    """

    PREDICTED = "predicted"
    STREAK = "streak"


class ShortfallPolicy(StrEnum):
    """At the round limit with the batch not full: ``error`` out, or train on the ``partial`` batch."""

    ERROR = "error"
    PARTIAL = "partial"


@dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """The dynamic-sampling batch replenisher (paper §3.2)."""

    enable: bool = field(default=True, metadata=verl_key("algorithm.filter_groups.enable", verl_native=True))
    """Train only on prompt groups whose responses disagree and refill the batch until it is full (paper §3.2)."""

    metric: str = field(default="acc", metadata=verl_key("algorithm.filter_groups.metric", verl_native=True))
    """Per-response value the filter reads: raw correctness (acc), never the length-shaped reward."""

    max_num_gen_batches: int = field(
        default=10, metadata=verl_key("algorithm.filter_groups.max_num_gen_batches", verl_native=True)
    )
    """Most generation rounds per training step; on_shortfall says what happens at the limit. Range >= 1; the published
    run uses 10.
    """

    train_batch_size: int = field(default=512, metadata=verl_key("data.train_batch_size", verl_native=True))
    """Prompt groups per training step. Paper §4.1 uses 512."""

    gen_batch_size: int | None = field(default=None, metadata=verl_key("data.gen_batch_size", verl_native=True))
    """Prompts per generation round (barrier) or in the first round (adaptive); null means train_batch_size. The
    published run uses 1536.
    """

    refill: str = field(default="adaptive", metadata=verl_key("algorithm.filter_groups.refill", verl_native=False))
    """barrier: fixed-size rounds as in verl-recipe; adaptive: each round sized from the observed keep rate."""

    single_round_probability: float = field(
        default=0.9, metadata=verl_key("algorithm.filter_groups.single_round_probability", verl_native=False)
    )
    """Adaptive refill: target probability that one round fills the batch. Range (0, 1)."""

    max_oversample_factor: float = field(
        default=4.0, metadata=verl_key("algorithm.filter_groups.max_oversample_factor", verl_native=False)
    )
    """Adaptive refill: a round asks for at most about this many prompts per missing group, plus the single-round
    margin. Keep rates below 1 / max_oversample_factor count as that floor. Range >= 1.
    """

    keep_rate_smoothing: float = field(
        default=0.3, metadata=verl_key("algorithm.filter_groups.keep_rate_smoothing", verl_native=False)
    )
    """Weight of the newest train_batch_size generated groups in the running keep-rate estimate. It averages over
    groups, so a small top-up round barely moves it. Range (0, 1].
    """

    surplus: str = field(default="discard", metadata=verl_key("algorithm.filter_groups.surplus", verl_native=False))
    """Informative groups beyond a full batch: discard (paper) or carry to the next steps (opt-in, slightly off-policy).
    """

    streaming: bool = field(default=False, metadata=verl_key("algorithm.filter_groups.streaming", verl_native=False))
    """Generate as a stream (verl v1 sync and colocate_async, the local backend): count groups as they finish, top up
    what is in flight as groups are dropped, and abort the rest once the batch is full instead of waiting for whole
    rounds; aborted groups are continued at the next step with surplus=carry (docs/verl.md). Off: rounds.
    """

    stream_oversample: float = field(
        default=1.0, metadata=verl_key("algorithm.filter_groups.stream_oversample", verl_native=False)
    )
    """Streaming engines only: keep this many times what one round would ask for the missing groups in flight, so the
    batch fills from the groups that finish first. With surplus=carry what is aborted continues at the next step (APRIL,
    arXiv 2509.18521, suggests about 2); with discard it is lost. Range >= 1.
    """

    max_staleness_steps: int = field(
        default=1, metadata=verl_key("algorithm.filter_groups.max_staleness_steps", verl_native=False)
    )
    """Carried groups older than this many training steps are dropped and counted. Range >= 1."""

    on_shortfall: str = field(
        default="error", metadata=verl_key("algorithm.filter_groups.on_shortfall", verl_native=False)
    )
    """At max_num_gen_batches with the batch not full: error (with the keep rate and the knob to turn) or partial (train
    on the groups found).
    """

    skip_uninformative: bool = field(
        default=True, metadata=verl_key("algorithm.filter_groups.skip_uninformative", verl_native=False)
    )
    """Choose prompts by what their past groups predict (prompt_selection says how) instead of visiting them uniformly.
    On by default (beyond the paper); false visits prompts uniformly.
    """

    prompt_selection: str = field(
        default="streak", metadata=verl_key("algorithm.filter_groups.prompt_selection", verl_native=False)
    )
    """With skip_uninformative: streak (pass over prompts after all-correct or all-wrong streaks, in proportion to how
    much less often such prompts were measured to be informative) or predicted (opt-in: rank candidates by a per-prompt
    prediction of an informative group and size rounds from the predicted yield; cheaper in simulation, no cheaper in
    the local backend's real runs, docs/benchmarks.md).
    """

    prediction_half_life_steps: float = field(
        default=10.0, metadata=verl_key("algorithm.filter_groups.prediction_half_life_steps", verl_native=False)
    )
    """prompt_selection=predicted: training steps after which a prompt's own groups count half as much in its
    predicted correct rate, so the estimate follows the policy as it learns. Range > 0 (10 and 20 measured alike).
    """

    selection_window: float = field(
        default=8.0, metadata=verl_key("algorithm.filter_groups.selection_window", verl_native=False)
    )
    """prompt_selection=predicted: candidate prompts drawn, in data order, per prompt generated; the rest are passed
    over until their next visit. Range >= 1 (1 takes prompts in data order). 8 was chosen on bench_sampler's
    tuning seeds (docs/benchmarks.md).
    """

    explore_fraction: float = field(
        default=0.05, metadata=verl_key("algorithm.filter_groups.explore_fraction", verl_native=False)
    )
    """prompt_selection=predicted: share of a round's prompts taken among the least known candidates (never
    generated, or long forgotten) whatever their prediction, so no prompt is starved for ever. Range [0, 1]; 0.2
    suits prefer_informative=true, which otherwise ranks fresh prompts below known informative ones.
    """

    prefer_informative: bool = field(
        default=False, metadata=verl_key("algorithm.filter_groups.prefer_informative", verl_native=False)
    )
    """prompt_selection=predicted: rank prompts predicted more informative than a fresh one above fresh ones, which
    trains on fewer distinct prompts (cheaper where prompts stay informative); false only passes over prompts
    predicted less informative than a fresh one.
    """

    skip_keep_base: float = field(
        default=0.5, metadata=verl_key("algorithm.filter_groups.skip_keep_base", verl_native=False)
    )
    """Deprecated and ignored: skipping follows the informative rate measured for each streak length. Remove the key.
    """

    max_skip_probability: float = field(
        default=0.9, metadata=verl_key("algorithm.filter_groups.max_skip_probability", verl_native=False)
    )
    """prompt_selection=streak: upper bound on any prompt's skip probability, so no prompt is skipped for good. Range
    [0, 1).
    """

    revisit_informative: bool = field(
        default=True, metadata=verl_key("algorithm.filter_groups.revisit_informative", verl_native=False)
    )
    """When informative groups are rare (keep rate below 1 / max_oversample_factor), re-ask prompts whose last group was
    informative, while they are measured to be more informative than fresh prompts. On by default (beyond the paper).
    """

    exhausted_streak: int = field(
        default=3, metadata=verl_key("algorithm.filter_groups.exhausted_streak", verl_native=False)
    )
    """A prompt counts as exhausted once this many of its groups in a row were all correct, or all wrong; the exhausted
    share of the prompt pool is logged as dapo/sampler/pool_exhausted_fraction. Range >= 1.
    """

    stop_when_exhausted: bool = field(
        default=False, metadata=verl_key("algorithm.filter_groups.stop_when_exhausted", verl_native=False)
    )
    """Opt-in: end training early once exhausted_pool_fraction of the prompt pool is exhausted (little left to learn).
    """

    exhausted_pool_fraction: float = field(
        default=0.9, metadata=verl_key("algorithm.filter_groups.exhausted_pool_fraction", verl_native=False)
    )
    """Share of the prompt pool that must be exhausted for stop_when_exhausted to end the run. Range (0, 1]."""

    seed: int = field(default=0, metadata=verl_key("data.seed", verl_native=True))
    """Seed of the sampler's prompt order and skip draws. Range [0, 2**32 - 1]."""

    def __post_init__(self) -> None:
        require_bool(
            self,
            "enable",
            "skip_uninformative",
            "revisit_informative",
            "stop_when_exhausted",
            "prefer_informative",
            "streaming",
        )
        if not isinstance(self.metric, str) or not self.metric:
            config_error(
                key_of(self, "metric"),
                self.metric,
                "must name a per-response value",
                "Use acc (raw correctness); filtering on a length-shaped score lets all-wrong groups through.",
            )
        require_number(
            self,
            "max_num_gen_batches",
            low=1,
            integer=True,
            fix="Unlimited rounds can loop forever on hard data; set a bound (the published run uses 10) "
            "and choose algorithm.filter_groups.on_shortfall.",
        )
        require_number(self, "train_batch_size", low=1, integer=True, fix="Use a positive number of prompts.")
        if self.gen_batch_size is not None:
            require_number(
                self,
                "gen_batch_size",
                low=1,
                integer=True,
                fix="Use a positive number of prompts, or null for train_batch_size.",
            )
        require_choice(self, "refill", RefillStrategy)
        require_number(
            self,
            "single_round_probability",
            low=0.0,
            high=1.0,
            low_open=True,
            fix="0.9 means 9 steps in 10 need a single round.",
        )
        if self.single_round_probability >= 1.0:
            config_error(
                key_of(self, "single_round_probability"),
                1.0,
                "would ask for unboundedly many prompts",
                "Use a value below 1, e.g. 0.9.",
            )
        require_number(self, "max_oversample_factor", low=1.0, fix="4.0 allows a keep rate down to 25%.")
        require_number(self, "keep_rate_smoothing", low=0.0, high=1.0, low_open=True, fix="0.3 is a good start.")
        require_choice(self, "surplus", SurplusPolicy)
        require_number(self, "stream_oversample", low=1.0, fix="1.0 keeps one round in flight; 2.0 twice that.")
        require_number(self, "max_staleness_steps", low=1, integer=True, fix="1 carries groups one step.")
        require_choice(self, "on_shortfall", ShortfallPolicy)
        if self.skip_keep_base != 0.5:
            warnings.warn(
                f"{key_of(self, 'skip_keep_base')}={self.skip_keep_base!r} is deprecated and ignored: "
                f"skipping now follows the informative rate measured for each streak length, bounded by "
                f"{key_of(self, 'max_skip_probability')}. Remove the key.",
                DeprecationWarning,
                stacklevel=3,
            )
        require_choice(self, "prompt_selection", PromptSelection)
        if self.prompt_selection == PromptSelection.PREDICTED and not (self.enable and self.skip_uninformative):
            off = key_of(self, "enable" if not self.enable else "skip_uninformative")  # predictions need both on
            config_error(
                key_of(self, "prompt_selection"),
                self.prompt_selection,
                f"chooses prompts only with {off}=true, but {off}=false, so the predictions would be silently ignored",
                f"Set {off}=true, or drop {key_of(self, 'prompt_selection')}=predicted.",
            )
        require_number(
            self,
            "prediction_half_life_steps",
            low=0.0,
            low_open=True,
            fix="10 halves a prompt's old evidence every 10 training steps.",
        )
        require_number(self, "selection_window", low=1.0, fix="8.0 draws 8 candidates per prompt generated.")
        require_number(self, "explore_fraction", low=0.0, high=1.0, fix="0.05 explores with 1 prompt in 20.")
        require_number(self, "max_skip_probability", low=0.0, high=1.0, fix="0.9 keeps 1 in 10 chances.")
        if self.max_skip_probability >= 1.0:
            config_error(
                key_of(self, "max_skip_probability"),
                self.max_skip_probability,
                "would skip prompts for good",
                "Use a value below 1, e.g. 0.9.",
            )
        require_number(
            self, "exhausted_streak", low=1, integer=True, fix="3 means solved (or failed) 3 times in a row."
        )
        require_number(
            self,
            "exhausted_pool_fraction",
            low=0.0,
            high=1.0,
            low_open=True,
            fix="0.9 stops when 9 prompts in 10 are exhausted.",
        )
        require_number(
            self,
            "seed",
            low=0,
            high=MAX_SEED,
            integer=True,
            fix=f"Use an integer seed from 0 to {MAX_SEED} (each epoch's prompt order is seeded from it).",
        )

    @property
    def prompts_per_round(self) -> int:
        """Prompts in a barrier round, and in the first adaptive round."""
        return self.gen_batch_size or self.train_batch_size
