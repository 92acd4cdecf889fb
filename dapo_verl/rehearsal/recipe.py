"""A recipe, composed and summarised once for every command that shows one (``doctor``, ``rehearse`` and its report).

:func:`compose_recipe` composes a config of ``configs/`` (or verl's ``ppo_trainer``) with the user's overrides as its
launcher would, checked by the pre-flight's override rules; :func:`recipe_summary` reads the keys that say what the
recipe runs, and :func:`component_settings` says it in one line per DAPO component. ``doctor`` prints those lines;
a rehearsal keeps the summary in its result, and its report lists each component with the evidence verl logged.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dapo_verl.config import CONFIG_DIR
from dapo_verl.rehearsal.changes import select
from dapo_verl.rehearsal.folders import RehearsalError

__all__ = ["RECIPE_KEYS", "VERL_CONFIG", "component_settings", "compose_recipe", "recipe_summary"]

VERL_CONFIG = "ppo_trainer"
"""verl's own trainer config: rehearsed through ``verl.trainer.main_ppo`` (the existing-setup user's path)."""

VERL_SEARCHPATH = "pkg://verl.trainer.config"


def _verl_config_dir() -> str:
    """verl's trainer config folder, found without importing verl (the import alone takes seconds)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RehearsalError("verl is not installed in this environment; install dapo_verl with its verl extra.")
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


def _searchpath_override(config_name: str, overrides: Sequence[str]) -> list[str]:
    """The recipe's Hydra search path with verl's package entry as a folder, so composing does not import verl.

    Hydra resolves ``pkg://verl.trainer.config`` by importing verl; the same folder given as ``file://`` composes
    the same config (a test compares them). Nothing is changed when the command line sets the search path.
    """
    if any(item.lstrip("+").startswith("hydra.searchpath") for item in overrides):
        return []
    entries = OmegaConf.load(CONFIG_DIR / f"{config_name}.yaml").get("hydra", {}).get("searchpath", [])
    if VERL_SEARCHPATH not in entries:
        return []
    folder = f"file://{_verl_config_dir()}"
    return [f"hydra.searchpath=[{','.join(folder if e == VERL_SEARCHPATH else e for e in entries)}]"]


def compose_recipe(config_name: str, overrides: Sequence[str]) -> tuple[DictConfig, list[str]]:
    """Compose ``config_name`` with ``overrides`` as its launcher would; return it and the entry command.

    Raises:
        RehearsalError: for a config name that is neither under ``configs/`` nor ``ppo_trainer``.
        dapo_verl.preflight.ConfigRefused: for overrides Hydra or the config would refuse (one problem each).
    """
    from dapo_verl.preflight import compose_config_dir

    searchpath: list[str] = []
    if config_name == VERL_CONFIG:
        config_dir, entry = _verl_config_dir(), [sys.executable, "-m", "verl.trainer.main_ppo"]
    elif (CONFIG_DIR / f"{config_name}.yaml").is_file():
        config_dir, entry = str(CONFIG_DIR), [sys.executable, "-m", "dapo_verl.main", f"--config-name={config_name}"]
        searchpath = _searchpath_override(config_name, overrides)
    else:
        names = sorted(
            p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem not in ("dapo_defaults", "local_defaults", "local")
        )
        raise RehearsalError(
            f"No config named {config_name!r}. Rehearse one of {', '.join(names)}, or {VERL_CONFIG} "
            f"(verl's own trainer, e.g. with the loss_mode=dapo overrides of an existing setup)."
        )
    config = compose_config_dir(config_dir, config_name, overrides, fixed_overrides=searchpath)
    return config, entry


RECIPE_KEYS = (
    "trainer.use_v1",
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high",
    "algorithm.adv_estimator",
    "reward.reward_manager.name",
    "reward.reward_kwargs.overlong_reward_penalty",
    "algorithm.overlong_filtering",
    "algorithm.filter_groups.enable",
    "algorithm.filter_groups.metric",
    "algorithm.filter_groups.refill",
    "algorithm.filter_groups.surplus",
    "algorithm.filter_groups.on_shortfall",
    "algorithm.filter_groups.skip_uninformative",
    "algorithm.filter_groups.prompt_selection",
    "algorithm.filter_groups.max_num_gen_batches",
    "actor_rollout_ref.rollout.n",
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "actor_rollout_ref.model.path",
    "data.train_batch_size",
    "data.max_response_length",
    "trainer.v1.trainer_mode",
    "trainer.v1.separate_async.hybrid_rollout.enable_switch",
    "algorithm.filter_groups.streaming",
)


def recipe_summary(config: DictConfig) -> dict[str, Any]:
    """The values of :data:`RECIPE_KEYS` in ``config`` (``"<unresolved: ...>"`` where it reads an unset variable)."""
    return {key: select(config, key) for key in RECIPE_KEYS}


def component_settings(summary: dict[str, Any]) -> dict[str, str]:
    """One line per DAPO component, saying how ``summary`` (:func:`recipe_summary`) sets it, in the paper's order."""
    actor, groups = "actor_rollout_ref.actor", "algorithm.filter_groups"
    low, high, agg = (summary.get(f"{actor}.{k}") for k in ("clip_ratio_low", "clip_ratio_high", "loss_agg_mode"))
    return {
        "decoupled-clip loss": f"loss_mode={summary.get(f'{actor}.policy_loss.loss_mode')}, eps {low}/{high}, {agg}",
        "group advantage": f"adv_estimator={summary.get('algorithm.adv_estimator')}",
        "reward manager": f"{summary.get('reward.reward_manager.name')}",
        "soft overlong punishment": (
            f"overlong_reward_penalty={summary.get('reward.reward_kwargs.overlong_reward_penalty')}"
        ),
        "overlong filtering": f"overlong_filtering={summary.get('algorithm.overlong_filtering')}",
        "dynamic sampling (batch replenisher)": (
            f"filter_groups.enable={summary.get(f'{groups}.enable')}, refill={summary.get(f'{groups}.refill')}, "
            f"surplus={summary.get(f'{groups}.surplus')}, on_shortfall={summary.get(f'{groups}.on_shortfall')}"
        ),
        "prompt prediction": (
            f"skip_uninformative={summary.get(f'{groups}.skip_uninformative')}, "
            f"prompt_selection={summary.get(f'{groups}.prompt_selection')}"
        ),
    }
