"""verl's config dataclasses, extended with the keys dapo_verl adds next to them.

verl instantiates config sections through their ``_target_`` and rejects unknown keys, so a section that
carries dapo_verl keys points its ``_target_`` here (``configs/dapo_trainer.yaml`` does this):

* ``algorithm._target_: dapo_verl.adapter.verl_config.DapoAlgoConfig`` -- adds ``adv_epsilon``,
  ``group_token_mean``, ``overlong_filtering``;
* ``algorithm.filter_groups._target_: dapo_verl.adapter.verl_config.DapoFilterGroupsConfig`` -- adds the
  sampler keys (``refill``, ``surplus``, ``max_staleness_steps``, ``on_shortfall``, ...).

The fields of dapo_verl's keys under a section are generated from ``dapo_verl.config`` (their single home:
same names, defaults and validation); keys verl already has keep verl's name but take DAPO's default (e.g.
``filter_groups.max_num_gen_batches=10`` rather than verl's unlimited 0). Each instance validates itself
when verl builds it, so a bad value fails at start-up.

``reward.reward_kwargs`` needs no dataclass: verl reads the ``reward`` section as a plain mapping (its
``RewardConfig`` cannot even be instantiated in verl 0.9.1, where ``RewardManagerConfig.__post_init__``
calls a ``super().__post_init__`` that does not exist), and the ``dapo_verl`` reward manager validates
those keys when it is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from verl.trainer.config import AlgoConfig, FilterGroupsConfig

from dapo_verl.config import AdvantageConfig, OverlongConfig, SamplerConfig, iter_verl_fields, read_verl_section

__all__ = ["DapoAlgoConfig", "DapoFilterGroupsConfig", "extension_keys"]


def extension_keys(section: str) -> list[str]:
    """The dapo_verl keys verl lacks that live directly under ``section`` (e.g. ``"algorithm"``)."""
    return [
        path.rsplit(".", 1)[1]
        for path, leaf in iter_verl_fields()
        if path.rsplit(".", 1)[0] == section and not leaf.metadata["verl_native"]
    ]


def _section_fields(section: str) -> list[tuple[str, Any, dataclasses.Field]]:
    """Every dapo_verl key directly under ``section``, with its dapo_verl default (verl's own keys included)."""
    fields = []
    for path, leaf in iter_verl_fields():
        if path.rsplit(".", 1)[0] == section:
            fields.append((leaf.name, Any, dataclasses.field(default=leaf.default)))
    return fields


def _extend(base: type, section: str, name: str, validate, doc: str) -> type:
    def __post_init__(self) -> None:
        parent = getattr(super(cls, self), "__post_init__", None)
        if parent is not None:
            parent()
        validate(self)

    cls = dataclasses.make_dataclass(
        name,
        _section_fields(section),
        bases=(base,),
        namespace={"__post_init__": __post_init__, "__doc__": doc, "__module__": __name__},
    )
    return cls


def _validate_algorithm(config: Any) -> None:
    read_verl_section(AdvantageConfig, {"algorithm": config})
    read_verl_section(OverlongConfig, {"algorithm": config})


def _validate_filter_groups(config: Any) -> None:
    read_verl_section(SamplerConfig, {"algorithm": {"filter_groups": config}})


DapoAlgoConfig = _extend(
    AlgoConfig,
    "algorithm",
    "DapoAlgoConfig",
    _validate_algorithm,
    "verl's AlgoConfig plus adv_epsilon, group_token_mean and overlong_filtering (see dapo_verl.config).",
)
DapoFilterGroupsConfig = _extend(
    FilterGroupsConfig,
    "algorithm.filter_groups",
    "DapoFilterGroupsConfig",
    _validate_filter_groups,
    "verl's FilterGroupsConfig plus the dynamic-sampling replenisher's keys (see dapo_verl.config.SamplerConfig).",
)
