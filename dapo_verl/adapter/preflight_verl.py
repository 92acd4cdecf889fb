"""What verl refuses at start-up, checked by verl's own code without starting anything.

Checks of :func:`dapo_verl.adapter.preflight.verl_config_problems`: the names verl looks up in its registries
(:func:`registered_names`), the sections verl turns into its config classes, turned into them the same way
(:func:`config_classes`), and verl's own ``validate_config`` (:func:`validate_config_problems`). verl's messages
are passed on as one line, with the fix added for the common micro-batch ones, and an unknown key of a config
class becomes one line naming the closest known key.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import io
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import is_dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dapo_verl.preflight import KnownKeys, Problem, one_line

__all__ = ["config_classes", "quiet", "registered_names", "registries", "validate_config_problems"]


def _get(config: DictConfig, key: str) -> Any:
    return OmegaConf.select(config, key, default=None)


def registries() -> dict[str, Sequence[str]]:
    """The names verl looks up at start-up, per key: its registries, with dapo_verl's names registered."""
    import verl.experimental.reward_loop.reward_manager  # noqa: F401  (registers verl's own managers)
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    import dapo_verl.adapter.register  # noqa: F401  (the names this package adds)

    return {
        "actor_rollout_ref.actor.policy_loss.loss_mode": sorted(POLICY_LOSS_REGISTRY),
        "algorithm.adv_estimator": sorted(ADV_ESTIMATOR_REGISTRY),
        "reward.reward_manager.name": sorted(REWARD_MANAGER),
        # verl has no public listing of its rollout engines; the registry's own table is read, never changed
        "actor_rollout_ref.rollout.name": sorted(RolloutReplicaRegistry._registry),
        "trainer.v1.trainer_mode": sorted(TRAINER_REGISTRY),
    }


def registered_names(config: DictConfig) -> list[Problem]:
    """Each looked-up name (loss, estimator, reward manager, rollout engine, v1 trainer mode) is registered."""
    problems = []
    for key, known in registries().items():
        if key == "reward.reward_manager.name" and _get(config, "reward.reward_manager.source") == "importlib":
            continue  # a class loaded from reward.reward_manager.module.path, not a registered name
        if key == "trainer.v1.trainer_mode" and not _get(config, "trainer.use_v1"):
            continue
        value = _get(config, key)
        if value in known:
            continue
        close = difflib.get_close_matches(str(value), known, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]}?" if close else ""
        shown = " is not set" if value is None else f"={value!r} is not registered in verl"
        problems.append(Problem(key, f"{key}{shown} (known: {', '.join(known)}); verl looks it up at start-up and "
                                     f"fails.{hint} Set {key} to one of the known names."))
    return problems



_VERL_FIXES = (
    (re.compile(r"Please set at least one of '(actor_rollout_ref\.\w+|actor)\.(\w+)' or '[\w.]+_per_gpu'"),
     "Set {section}.{param}_per_gpu (e.g. 4), or actor_rollout_ref.actor.use_dynamic_bsz=true with "
     "ppo_max_token_len_per_gpu."),
    (re.compile(r"You have set both '([\w.]+)\.(\w+)' AND"),
     "Remove {section}.{param} (deprecated), or set {section}.{param}_per_gpu=null to keep it."),
)


def _verl_message(err: BaseException) -> str:
    """The innermost message of verl's error (Hydra wraps a failing config class in InstantiationException)."""
    while err.__cause__ is not None or err.__context__ is not None:
        inner = err.__cause__ or err.__context__
        if inner is None or isinstance(inner, KeyboardInterrupt):
            break
        err = inner
    text = one_line(err) or type(err).__name__
    for pattern, fix in _VERL_FIXES:
        match = pattern.search(text)
        if match:
            section = match.group(1) if match.group(1).startswith("actor_rollout_ref") else "actor_rollout_ref.actor"
            text += " " + fix.format(section=section, param=match.group(2))
    return text


def validate_config_problems(config: DictConfig) -> list[Problem]:
    """verl's own ``validate_config`` (batch sizes across GPUs, micro-batch settings), as one problem."""
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.utils.config import validate_config

    try:
        # use_critic=False: a critic's config class loads the critic's model; no DAPO recipe has a critic
        validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=False)
    except Exception as err:  # verl raises AssertionError, ValueError or Hydra's InstantiationException
        return [_class_problem("actor_rollout_ref.actor", err, KnownKeys.of(config),
                               prefix="verl's validate_config refuses the config")]
    return []


def config_classes(config: DictConfig) -> list[Problem]:
    """Each section verl builds a config class from at start-up, built the same way (the model's only typed)."""
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass

    known = KnownKeys.of(config)
    sections = ["actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.rollout.checkpoint_engine",
                "algorithm", *(["actor_rollout_ref.ref"] if need_reference_policy(config) else [])]
    problems = []
    for section in ["actor_rollout_ref.model", *sections]:
        node = OmegaConf.select(config, section)
        if not isinstance(node, DictConfig) or "_target_" not in node:
            continue
        if section == "actor_rollout_ref.model":  # its class loads the tokenizer: check keys and types only
            typed = _typed_problem(section, node, known)
            problems += [typed] if typed is not None else []
            continue
        try:
            omega_conf_to_dataclass(node)
        except Exception as err:  # whatever the config class raises is what verl would raise
            problems.append(_class_problem(section, err, known))
    return problems


def _typed_problem(section: str, node: DictConfig, known: KnownKeys) -> Problem | None:
    """Check ``node``'s keys and types against its config class without running the class's checks."""
    module, _, name = str(node._target_).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        return Problem(f"{section}._target_", f"{section}._target_={node._target_!r} cannot be imported ({err}). "
                                              f"Keep the config's _target_.")
    if not is_dataclass(cls):
        return None
    try:
        OmegaConf.merge(OmegaConf.structured(cls), node)
    except Exception as err:  # OmegaConf's validation errors: unknown key, wrong type
        return _class_problem(section, err, known)
    return None


_UNKNOWN_FIELD = re.compile(r"Key '(\w+)' not in '(\w+)'"
                            r"|(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")
_FULL_KEY = re.compile(r"full_key: ([\w.]+)")


def _class_problem(section: str, err: BaseException, known: KnownKeys, *,
                   prefix: str = "") -> Problem:
    """One line for an error of verl's config classes: an unknown key with the closest known one, else verl's text."""
    text = _verl_message(err)
    full = _FULL_KEY.search(one_line(err))
    key = full.group(1) if full else section
    key = key if key.startswith(section) or "." in key else f"{section}.{key}"
    unknown = _UNKNOWN_FIELD.search(one_line(err))
    if unknown:
        field_name, cls = (unknown.group(1), unknown.group(2)) if unknown.group(1) else (unknown.group(4),
                                                                                         unknown.group(3))
        key = key if key.endswith(f".{field_name}") else f"{key}.{field_name}"
        others = KnownKeys(known.leaves - {key}, known.nodes - {key}, known.values)
        return Problem(key, f"{key} is not a field of verl's {cls}, which verl builds from {key.rsplit('.', 1)[0]} at "
                            f"start-up and which refuses unknown keys; {others.hint(key)} Remove it or correct it.")
    return Problem(key, f"{prefix or f'verl refuses {section} when it builds its config class'}: {text}")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """verl's checks print their progress ("All configuration checks passed") and its imports warn about engines
    this machine lacks; keep the caller's output clean."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
