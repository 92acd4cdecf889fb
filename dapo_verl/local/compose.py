"""Compose a local run's configuration with Hydra and check it as a whole before anything runs.

The primary config is ``configs/local.yaml``: it composes ``dapo_defaults`` (every DAPO key, generated
from :mod:`dapo_verl.config`), ``local_defaults`` (the keys of :mod:`dapo_verl.local.config`, generated from
its dataclasses the same way: ``dapo-verl config --write``) and its own overrides for the embedded
experiment. Command-line overrides use Hydra's ``key=value`` grammar. A key the composed config does not
hold is refused before Hydra sees it, ``+key`` and ``++key`` included, with the closest valid key (the
local backend reads only its own keys, so an added key would be ignored without a word), and so is a deletion
(``~key``), which would train with an internal default the saved config does not show; the override checks are
:mod:`dapo_verl.preflight`'s, shared with every other entry point.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dapo_verl.config import CONFIG_DIR, DapoConfig, clip_higher_inert_reason
from dapo_verl.local.config import LocalRunConfig, read_run_config
from dapo_verl.local.tasks import make_task
from dapo_verl.preflight import ConfigRefused, KnownKeys, Problem, compose_checked

__all__ = ["CONFIG_DIR", "PRIMARY_CONFIG", "RunSpec", "changed_keys", "compose_run", "flatten_keys"]

logger = logging.getLogger(__name__)

PRIMARY_CONFIG = "local"
_FILTER_METRICS = ("acc",)


@dataclass(frozen=True)
class RunSpec:
    """A composed and validated local run configuration.

    Attributes:
        cfg: The whole resolved config as plain nested dicts (saved as the run's ``config.yaml``).
        dapo: The DAPO settings read from it.
        run: The local settings read from it.
    """

    cfg: dict[str, Any]
    dapo: DapoConfig
    run: LocalRunConfig

    @property
    def seed(self) -> int:
        """``data.seed``: seeds the prompt order, the model's initialisation and the sampling."""
        return self.dapo.sampler.seed

    def to_yaml(self) -> str:
        """The resolved config as YAML text."""
        return OmegaConf.to_yaml(OmegaConf.create(self.cfg))


def compose_run(
    overrides: Sequence[str] = (), *, out_dir: str | Path | None = None, config_name: str = PRIMARY_CONFIG
) -> RunSpec:
    """Compose ``configs/<config_name>.yaml`` with ``overrides`` and validate the result.

    Args:
        overrides: Hydra overrides such as ``["actor_rollout_ref.actor.optim.lr=3e-4", "data.seed=1"]``.
        out_dir: Run directory; replaces ``trainer.default_local_dir`` when given.
        config_name: Primary config in ``dapo_verl/configs``.

    Raises:
        ValueError: for an override Hydra cannot apply or any invalid value, naming the key and the fix.
    """
    composed = compose_checked(
        lambda given: _compose(config_name, given),
        overrides,
        label=f"the local backend's config (configs/{config_name}.yaml)",
        additions=False,
        unknown_why=_UNKNOWN_WHY,
        known=_known_keys(config_name),
    )
    if out_dir is not None:
        composed.trainer.default_local_dir = str(out_dir)
    cfg: dict[str, Any] = OmegaConf.to_container(composed, resolve=True)  # type: ignore[assignment]
    known = _known_keys(config_name)
    extra = sorted(set(flatten_keys(cfg)) - known.leaves)
    if extra:
        raise ConfigRefused(
            [
                Problem(
                    key,
                    f"{key} (in overrides {list(overrides)}) is not a key of the local backend's "
                    f"config (configs/{config_name}.yaml); {known.hint(key)} {_UNKNOWN_WHY}",
                )
                for key in extra
            ]
        )
    spec = RunSpec(cfg=cfg, dapo=DapoConfig.from_verl(cfg), run=read_run_config(cfg))
    check_run(spec)
    return spec


def _compose(config_name: str, overrides: Sequence[str]) -> Any:
    with initialize_config_dir(version_base=None, config_dir=str(CONFIG_DIR), job_name="dapo_verl_local"):
        return compose(config_name=config_name, overrides=list(overrides))


_UNKNOWN_WHY = (
    "The local backend reads only its own keys, so an added key (+key) would be ignored. Use one of the "
    "keys `dapo-verl train --print-config` lists."
)


@functools.lru_cache(maxsize=4)
def _known_keys(config_name: str) -> KnownKeys:
    """The keys of ``configs/<config_name>.yaml`` as composed without overrides (cached per process)."""
    return KnownKeys.of(_compose(config_name, ()))


STREAMING_CARRY_WARNING = (
    "algorithm.filter_groups.streaming=true with surplus=carry and local.rollout.stale_prefix=mask on the local "
    "backend: a continued group's tokens from an earlier policy are masked out of its loss, and in the declared guard "
    "(docs/local.md, 26 seeds) this lost 0.25 of held-out accuracy AUC against rounds, on every seed; with "
    "stale_prefix=train (the default) the declared follow-up held it. Use stale_prefix=train for results."
)
"""The warning of a local run that streams, carries and masks the older prefix (its measured accuracy loss)."""


def check_run(spec: RunSpec) -> None:
    """Cross-key checks of a local run; warns once when clip-higher cannot act, and when it streams, carries and
    masks the older prefix.

    Raises:
        ValueError: naming the offending key and how to fix it.
    """
    dapo, actor = spec.dapo, spec.run.actor
    _ = dapo.loss.aggregation  # raises for loss_agg_mode values only verl implements
    make_task(spec.run.local.task.name, heldout_size=spec.run.local.task.heldout_size, seed=spec.seed)  # fits?
    if dapo.sampler.metric not in _FILTER_METRICS:
        raise ValueError(
            f"algorithm.filter_groups.metric={dapo.sampler.metric!r} is not reported by the local verifier, which "
            f"reports {list(_FILTER_METRICS)} (raw correctness; filtering on the length-shaped score would let "
            f"all-wrong groups through). Set algorithm.filter_groups.metric=acc."
        )
    batch = dapo.sampler.train_batch_size
    if actor.ppo_mini_batch_size > batch or batch % actor.ppo_mini_batch_size:
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} does not divide "
            f"data.train_batch_size={batch}; every gradient step must see the same number of prompt groups. "
            f"Use a divisor of {batch}, e.g. {max(1, batch // 4)}."
        )
    reason = clip_higher_inert_reason(
        train_batch_size=batch, ppo_mini_batch_size=actor.ppo_mini_batch_size, ppo_epochs=actor.ppo_epochs
    )
    if reason is not None:
        logger.warning("%s", reason)
    if dapo.sampler.streaming and dapo.sampler.surplus == "carry" and spec.run.rollout.stale_prefix == "mask":
        logger.warning("%s", STREAMING_CARRY_WARNING)


def flatten_keys(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{dotted.key: value}``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changed_keys(saved: Mapping[str, Any], wanted: Mapping[str, Any], *, ignore: Collection[str] = ()) -> list[str]:
    """Dotted keys whose values differ between two nested configs (present in either), minus ``ignore``."""
    a, b = flatten_keys(saved), flatten_keys(wanted)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and k not in ignore)
