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
enums from ``dapo_verl.core``. The sampler's section (:class:`SamplerConfig` and its choices) is declared in
:mod:`dapo_verl.config_sampler` and the field helpers (:func:`verl_key`, the ``require_*`` checks) in
:mod:`dapo_verl.config_fields`; both are re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from enum import StrEnum
from typing import Any, TypeVar

from dapo_verl.config_fields import (
    MAX_SEED,
    config_error,
    key_of,
    require_bool,
    require_choice,
    require_number,
    verl_key,
)
from dapo_verl.config_sampler import PromptSelection, RefillStrategy, SamplerConfig, ShortfallPolicy, SurplusPolicy
from dapo_verl.core.losses import LossAggregation
from dapo_verl.core.rewards import OVERLONG_SCHEDULES

__all__ = [
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
        default=0.2, metadata=verl_key("actor_rollout_ref.actor.clip_ratio_low", verl_native=True)
    )
    """eps_low: the ratio is clipped below at 1 - clip_ratio_low for negative advantages. Range [0, 1]; paper §3.1 uses
    0.2.
    """

    clip_ratio_high: float = field(
        default=0.28, metadata=verl_key("actor_rollout_ref.actor.clip_ratio_high", verl_native=True)
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
