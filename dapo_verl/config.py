"""Every DAPO knob, declared once: frozen dataclasses that are the single home of each default.

Each field carries the dotted key it has in a verl Hydra config (``metadata["verl_key"]``). Where verl
already has a key (``actor_rollout_ref.actor.clip_ratio_high``, ``algorithm.filter_groups.enable``,
``data.gen_batch_size``, ...) that key is used with verl's meaning; the keys verl lacks sit next to the
related verl keys (``algorithm.filter_groups.refill``, ``reward.reward_kwargs.overlong_tokens``, ...).
The same mapping drives:

* :meth:`DapoConfig.from_verl`, which reads a (composed) verl-shaped config, local or cluster;
* :mod:`tools.config_docs`, which generates ``configs/dapo_defaults.yaml`` (each key's comment is the
  first sentence of its field docstring) and the reference in docs/configuration.md, and tests that keep
  both in step with the dataclasses;
* ``dapo_verl.adapter.verl_config``, which extends verl's own config dataclasses with the new keys.

Defaults follow the paper (arXiv 2503.14476, §4.1) and the published verl DAPO run, except for three
sampler behaviours that only change what dynamic sampling spends, each measured in benchmarks/README.md:
adaptive round sizing, skipping prompts their history measures to be uninformative, and
revisiting informative prompts when informative groups are rare (``refill``, ``skip_uninformative``,
``revisit_informative``; set them to ``barrier``, false, false for the paper's sampler). Carrying surplus
groups, which trains slightly off-policy, stays opt-in. Imports only the standard library and
enums from ``dapo_verl.core``.

Layout: the field helpers first (:func:`verl_key` declares a field's verl key; the ``require_*`` checks raise through
:func:`config_error` in the one format ``key=value why. fix``), then the sampler's section (:class:`SamplerConfig`
and its choices), then the loss, advantage and overlong sections and :class:`DapoConfig`, which holds them all.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from dapo_verl.core.losses import CLIP_HIGH, CLIP_LOW, LossAggregation
from dapo_verl.core.rewards import OVERLONG_SCHEDULES

__all__ = [
    "CONFIG_DIR",
    "MAX_SEED",
    "VERL_LOSS_AGG_MODES",
    "AdvantageConfig",
    "DapoConfig",
    "LossConfig",
    "OverlongConfig",
    "PromptSelection",
    "RefillStrategy",
    "SamplerConfig",
    "ShortfallPolicy",
    "SurplusPolicy",
    "clip_higher_inert_reason",
    "config_error",
    "defaults_tree",
    "iter_verl_fields",
    "key_of",
    "read_verl_section",
    "require_bool",
    "require_choice",
    "require_number",
    "verl_key",
]


# -- fields: each one's verl key and the checks every section uses ----------------------------------------

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
"""The Hydra configs the package ships (recipes, ``dapo_defaults.yaml``, ``local.yaml``); located here only."""

MAX_SEED = 2**32 - 1
"""Largest ``data.seed``: the sampler derives a torch seed per epoch from it, which must fit in 64 bits."""


def verl_key(path: str, *, verl_native: bool) -> dict[str, Any]:
    """Field metadata: the dotted key of a config field in a verl Hydra config, and whether verl has it."""
    return {"verl_key": path, "verl_native": verl_native}


def config_error(key: str, value: object, why: str, fix: str) -> NoReturn:
    """Raise the configuration ``ValueError`` in its one format: ``key=value why. fix``."""
    raise ValueError(f"{key}={value!r} {why}. {fix}")


def key_of(config: Any, name: str) -> str:
    """The dotted config key of field ``name`` of a config dataclass (instance or class)."""
    return next(f.metadata["verl_key"] for f in fields(config) if f.name == name)


def require_bool(config: Any, *names: str) -> None:
    """Raise unless each named field of ``config`` is a boolean."""
    for name in names:
        if not isinstance(getattr(config, name), bool):
            config_error(
                key_of(config, name),
                getattr(config, name),
                "must be a boolean",
                "Use true or false, unquoted (a quoted 'false' is a string).",
            )


def require_number(
    config: object, name: str, *, low: float, high: float = math.inf, low_open=False, integer=False, fix: str
) -> None:
    """Raise unless field ``name`` is a finite number (an integer if ``integer``) within ``[low, high]``."""
    value = getattr(config, name)
    key = key_of(config, name)
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value):
        config_error(key, value, f"must be a finite {'integer' if integer else 'number'}", fix)
    if value < low or (low_open and value == low) or value > high:
        if math.isinf(high):
            config_error(key, value, f"must be {'>' if low_open else '>='} {low}", fix)
        config_error(key, value, f"must lie in {'(' if low_open else '['}{low}, {high}]", fix)


def require_choice(config: object, name: str, choices: type[StrEnum] | list[str], fix: str = "") -> None:
    """Raise unless field ``name`` holds one of ``choices`` (an enum's values or a list)."""
    value = getattr(config, name)
    known = [c.value for c in choices] if isinstance(choices, type) else list(choices)
    if value not in known:
        config_error(key_of(config, name), value, f"is not one of {known}", fix or "Pick one of the listed values.")


# -- the sampler's section: algorithm.filter_groups.* and the batch sizes it fills --------------------


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
    batch fills from the groups that finish first. With surplus=carry what is aborted continues at the next step; with
    discard it is lost. At the paper's scale (simulated with vLLM's KV cache) 1.5 with surplus=carry and
    max_staleness_steps=2 was the fastest setting; 2, APRIL's suggestion, overflows the cache (docs/benchmarks.md).
    Range >= 1.
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


# -- the loss, the advantage, overlong shaping, and the whole config --------------------------------------

VERL_LOSS_AGG_MODES: dict[str, LossAggregation | None] = {
    "token-mean": LossAggregation.TOKEN_MEAN_GLOBAL,
    "seq-mean-token-mean": LossAggregation.SEQ_MEAN_TOKEN_MEAN,
    "seq-mean-token-sum": LossAggregation.SEQ_MEAN_TOKEN_SUM,
    "token-sum": None,
    "seq-mean-token-sum-norm": None,
}
"""verl's ``loss_agg_mode`` values; those mapped to None run in verl but not on the local backend."""


_Section = TypeVar("_Section")


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """The decoupled-clip policy loss (paper §3.1, §3.3)."""

    clip_ratio_low: float = field(
        default=CLIP_LOW, metadata=verl_key("actor_rollout_ref.actor.clip_ratio_low", verl_native=True)
    )
    """eps_low: the ratio is clipped below at 1 - clip_ratio_low for negative advantages. Range [0, 1]; paper §3.1 uses
    0.2.
    """

    clip_ratio_high: float = field(
        default=CLIP_HIGH, metadata=verl_key("actor_rollout_ref.actor.clip_ratio_high", verl_native=True)
    )
    """eps_high: the ratio is clipped above at 1 + clip_ratio_high for positive advantages (clip-higher). Range >= 0;
    paper §3.1 uses 0.28.
    """

    clip_ratio_c: float = field(
        default=10.0, metadata=verl_key("actor_rollout_ref.actor.clip_ratio_c", verl_native=True)
    )
    """Dual-clip constant: for negative advantages the per-token loss is capped at -A * clip_ratio_c. Must be > 1; the
    published verl DAPO run uses 10.0.
    """

    loss_agg_mode: str = field(
        default="token-mean", metadata=verl_key("actor_rollout_ref.actor.loss_agg_mode", verl_native=True)
    )
    """How per-token losses become a scalar, in verl's names; token-mean is DAPO's token-level loss over the whole
    mini-batch (paper §3.3).
    """

    def __post_init__(self) -> None:
        require_number(self, "clip_ratio_low", low=0.0, high=1.0, fix="The paper uses 0.2.")
        require_number(self, "clip_ratio_high", low=0.0, fix="The paper uses 0.28.")
        require_number(
            self,
            "clip_ratio_c",
            low=1.0,
            low_open=True,
            fix="Dual clip needs a constant above 1; the published DAPO run uses 10.0.",
        )
        require_choice(self, "loss_agg_mode", list(VERL_LOSS_AGG_MODES), fix="DAPO's token-level loss is token-mean.")

    @property
    def aggregation(self) -> LossAggregation:
        """The core aggregation for ``loss_agg_mode``; ValueError for modes only verl implements."""
        mode = VERL_LOSS_AGG_MODES[self.loss_agg_mode]
        if mode is None:
            supported = [k for k, v in VERL_LOSS_AGG_MODES.items() if v is not None]
            config_error(
                key_of(self, "loss_agg_mode"),
                self.loss_agg_mode,
                "runs in verl but not on the local backend",
                f"Use one of {supported}.",
            )
        return mode


@dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """The group-normalised outcome advantage (paper Eq. 9)."""

    norm_adv_by_std_in_grpo: bool = field(
        default=True, metadata=verl_key("algorithm.norm_adv_by_std_in_grpo", verl_native=True)
    )
    """Divide each centred reward by its group's standard deviation (paper Eq. 9); false gives Dr. GRPO."""

    adv_epsilon: float = field(default=1e-6, metadata=verl_key("algorithm.adv_epsilon", verl_native=False))
    """Added to the group standard deviation before dividing. Range >= 0; 1e-6 as in verl's grpo."""

    group_token_mean: bool = field(default=False, metadata=verl_key("algorithm.group_token_mean", verl_native=False))
    """Opt-in per-group reading of the token-level loss (verl#2776): advantages are weighted so that, with
    loss_agg_mode=seq-mean-token-sum, each prompt group's tokens average within the group.
    """

    def __post_init__(self) -> None:
        require_bool(self, "norm_adv_by_std_in_grpo", "group_token_mean")
        require_number(self, "adv_epsilon", low=0.0, fix="Use a small value such as 1e-6.")


@dataclass(frozen=True, kw_only=True)
class OverlongConfig:
    """Overlong reward shaping and filtering (paper §3.4)."""

    overlong_reward_penalty: bool = field(
        default=True, metadata=verl_key("reward.reward_kwargs.overlong_reward_penalty", verl_native=False)
    )
    """Add the soft overlong punishment to the reward of responses that run into the buffer before max_response_length
    (paper §3.4, Eq. 13).
    """

    overlong_tokens: int = field(
        default=4096, metadata=verl_key("reward.reward_kwargs.overlong_tokens", verl_native=False)
    )
    """Length of the penalty ramp in tokens, ending at max_response_length. Range (0, max_response_length]; paper §4.1
    uses 4096.
    """

    overlong_penalty_factor: float = field(
        default=1.0, metadata=verl_key("reward.reward_kwargs.overlong_penalty_factor", verl_native=False)
    )
    """Penalty at and beyond max_response_length. Range >= 0; paper §3.4 uses 1.0."""

    overlong_schedule: str = field(
        default="linear", metadata=verl_key("reward.reward_kwargs.overlong_schedule", verl_native=False)
    )
    """Shape of the ramp: a name registered with dapo_verl.core.rewards.register_overlong_schedule; linear is the
    paper's.
    """

    overlong_filtering: bool = field(
        default=False, metadata=verl_key("algorithm.overlong_filtering", verl_native=False)
    )
    """Give truncated responses no loss (paper §3.4, overlong filtering); off as in the best published run."""

    def __post_init__(self) -> None:
        require_bool(self, "overlong_reward_penalty", "overlong_filtering")
        require_number(
            self,
            "overlong_tokens",
            low=0,
            low_open=True,
            integer=True,
            fix="The paper uses 4096; to turn the penalty off set overlong_reward_penalty=false.",
        )
        require_number(self, "overlong_penalty_factor", low=0.0, fix="The paper uses 1.0.")
        require_choice(
            self,
            "overlong_schedule",
            OVERLONG_SCHEDULES.names(),
            fix="Register new schedules with @register_overlong_schedule in dapo_verl/core/rewards.py.",
        )


@dataclass(frozen=True, kw_only=True)
class DapoConfig:
    """All of DAPO: loss, advantage, overlong shaping and dynamic sampling."""

    loss: LossConfig = field(default_factory=LossConfig)
    """The decoupled-clip policy loss."""

    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """The group-normalised advantage."""

    overlong: OverlongConfig = field(default_factory=OverlongConfig)
    """Overlong reward shaping and filtering."""

    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """Dynamic sampling."""

    max_response_length: int = field(default=20480, metadata=verl_key("data.max_response_length", verl_native=True))
    """Generation budget per response in tokens. Paper §4.1 uses 20480."""

    def __post_init__(self) -> None:
        require_number(self, "max_response_length", low=1, integer=True, fix="The paper uses 20480.")
        if self.overlong.overlong_reward_penalty and self.overlong.overlong_tokens > self.max_response_length:
            config_error(
                "reward.reward_kwargs.overlong_tokens",
                self.overlong.overlong_tokens,
                f"exceeds data.max_response_length={self.max_response_length}; the penalty ramp must fit "
                f"inside the response budget",
                f"Set overlong_tokens <= {self.max_response_length} (the paper uses 4096 of 20480).",
            )
        if self.advantage.group_token_mean and self.loss.loss_agg_mode != "seq-mean-token-sum":
            config_error(
                "actor_rollout_ref.actor.loss_agg_mode",
                self.loss.loss_agg_mode,
                "does not match algorithm.group_token_mean=true, whose advantage weights assume a loss "
                "divided by the number of responses",
                "Set actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum.",
            )

    @classmethod
    def from_verl(cls, cfg: Mapping[str, Any]) -> DapoConfig:
        """Read every DAPO key from a verl-shaped nested mapping (dict, DictConfig or verl BaseConfig).

        A key that is absent, or null where the field does not accept null, takes the dataclass default.
        Verl's own overlong keys (``reward.reward_kwargs.overlong_buffer_cfg.{enable,len,penalty_factor}``)
        are accepted as aliases of ours; if both are given they must agree.

        Raises:
            ValueError: naming the full key of any invalid value and how to fix it.
        """
        return read_verl_section(cls, cfg)

    def to_verl(self) -> dict[str, Any]:
        """Nested verl-shaped dict of every key (the inverse of :meth:`from_verl`)."""
        tree: dict[str, Any] = {}
        for path, f in iter_verl_fields():
            node = tree
            *parents, leaf = path.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = _get_path(self, f)
        return tree


_MISSING = object()


def read_verl_section(cls: type[_Section], cfg: Mapping[str, Any]) -> _Section:
    """Build a config dataclass (``DapoConfig``, a part such as ``OverlongConfig``, or any dataclass tree whose
    leaves carry :func:`verl_key` metadata) from a verl-shaped mapping.

    Only that dataclass's keys are read and validated, so a component that sees part of a verl config
    (the advantage estimator sees ``algorithm`` only) can read its own settings: wrap the part, e.g.
    ``read_verl_section(AdvantageConfig, {"algorithm": algo_cfg})``. Absent or null keys take the
    dataclass default; verl's ``overlong_buffer_cfg`` keys are accepted as aliases (see
    :meth:`DapoConfig.from_verl`).
    """
    values = {path: _lookup(cfg, path) for path, _ in iter_verl_fields(cls)}
    _merge_verl_overlong_aliases(cfg, values)
    return _build(cls, values)


def iter_verl_fields(cls: type = DapoConfig, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """Yield ``(verl_key, leaf)`` for every leaf field of ``cls``, nested ones included.

    ``leaf.attr_path`` is the attribute path from ``cls`` (e.g. ``("sampler", "refill")``) and
    ``leaf.field`` the ``dataclasses.Field``.
    """
    for f in fields(cls):
        sub = _nested_type(f)
        if sub is not None:
            yield from iter_verl_fields(sub, (*prefix, f.name))
        else:
            yield f.metadata["verl_key"], _Leaf((*prefix, f.name), f)


@dataclass(frozen=True)
class _Leaf:
    attr_path: tuple[str, ...]
    field: Any

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.field.metadata

    @property
    def default(self) -> Any:
        return self.field.default


def _nested_type(f: Any) -> Any:
    """The nested config dataclass a field holds (``loss``, ``sampler``, ...), or None for a leaf."""
    if f.default_factory is not MISSING and is_dataclass(f.default_factory):
        return f.default_factory
    return None


def _get_path(config: object, leaf: _Leaf) -> Any:
    for part in leaf.attr_path:
        config = getattr(config, part)
    return config


def _lookup(cfg: Mapping[str, Any], path: str) -> Any:
    node: Any = cfg
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return _MISSING
        try:
            node = node[part]
        except (KeyError, AttributeError):  # verl's BaseConfig raises AttributeError for unknown keys
            return _MISSING
    return node


def _merge_verl_overlong_aliases(cfg: Mapping[str, Any], values: dict[str, Any]) -> None:
    """Fold verl's ``overlong_buffer_cfg`` into our keys, refusing contradictions."""
    buffer = _lookup(cfg, "reward.reward_kwargs.overlong_buffer_cfg")
    if buffer is _MISSING or buffer is None:
        return
    aliases = {
        "enable": "reward.reward_kwargs.overlong_reward_penalty",
        "len": "reward.reward_kwargs.overlong_tokens",
        "penalty_factor": "reward.reward_kwargs.overlong_penalty_factor",
    }
    for verl_name, ours in aliases.items():
        theirs = buffer.get(verl_name, _MISSING) if isinstance(buffer, Mapping) else _MISSING
        if theirs is _MISSING or ours not in values:
            continue
        if values[ours] not in (_MISSING, None) and values[ours] != theirs:
            config_error(
                ours,
                values[ours],
                f"contradicts reward.reward_kwargs.overlong_buffer_cfg.{verl_name}={theirs!r}",
                "Set only one of the two (dapo_verl reads both).",
            )
        values[ours] = theirs
    max_resp_len = _lookup(cfg, "reward.reward_kwargs.max_resp_len")
    budget = values.get("data.max_response_length", _MISSING)
    if max_resp_len not in (_MISSING, None) and budget not in (_MISSING, None) and max_resp_len != budget:
        config_error(
            "reward.reward_kwargs.max_resp_len",
            max_resp_len,
            f"differs from data.max_response_length={budget}",
            "Remove max_resp_len; it is read from data.",
        )


def _build(cls: type, values: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Any:
    kwargs: dict[str, Any] = {}
    for f in fields(cls):
        sub = _nested_type(f)
        if sub is not None:
            kwargs[f.name] = _build(sub, values, (*prefix, f.name))
            continue
        value = values[f.metadata["verl_key"]]
        if value is _MISSING or (value is None and f.default is not None):
            continue
        kwargs[f.name] = _plain(value)
    return cls(**kwargs)


def _plain(value: Any) -> Any:
    """Strip enum and container wrappers so dataclass checks see plain Python values."""
    if isinstance(value, StrEnum):
        return value.value
    return value


def defaults_tree(cls: type) -> dict[str, Any]:
    """Nested dict of every key of the config dataclass ``cls`` at its verl path, holding its default."""
    tree: dict[str, Any] = {}
    for path, leaf in iter_verl_fields(cls):
        node = tree
        *parents, name = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = leaf.default
    return tree


def clip_higher_inert_reason(*, train_batch_size: int, ppo_mini_batch_size: int, ppo_epochs: int) -> str | None:
    """Why clip-higher cannot act under this batching, or None if it can.

    With one mini-batch and one epoch every update is on-policy: the ratio is exactly 1, so neither clip
    bound is ever reached (verl#791). Clip-higher needs several gradient steps per rollout.
    """
    if ppo_epochs <= 1 and ppo_mini_batch_size >= train_batch_size:
        return (
            f"clip_ratio_high has no effect: ppo_mini_batch_size={ppo_mini_batch_size} >= "
            f"train_batch_size={train_batch_size} with ppo_epochs={ppo_epochs} makes every update on-policy "
            f"(ratio == 1), so no token reaches a clip bound. Use several mini-batches per rollout (the paper "
            f"takes 16 gradient steps per rollout: ppo_mini_batch_size = train_batch_size / 16)."
        )
    return None
