"""What verl refuses at start-up, checked by verl's own code without starting anything.

Checks of :func:`dapo_verl.adapter.preflight.verl_config_problems`: the names verl looks up in its registries
(:func:`registered_names`), the sections verl turns into its config classes, turned into them the same way
(:func:`config_classes`), and verl's own ``validate_config`` (:func:`validate_config_problems`). verl's messages
are passed on as one line, with the fix added for the common micro-batch ones, and an unknown key of a config
class becomes one line naming the closest known key.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import importlib
import io
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, is_dataclass
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
        problems.append(
            Problem(
                key,
                f"{key}{shown} (known: {', '.join(known)}); verl looks it up at start-up and "
                f"fails.{hint} Set {key} to one of the known names.",
            )
        )
    return problems


@dataclass(frozen=True)
class _KnownError:
    """One of verl's micro-batch and batch-size messages, which dapo_verl can say more about.

    Attributes:
        pattern: Matches verl's message.
        key: The full key at fault, from the match.
        fix: What to change, from the match.
        settle: A value for :attr:`key` that makes verl's check pass in a scratch copy of the config, so that its
            later checks still run. Settling only removes problems about that key, never adds one: every settled
            value satisfies each check of verl's that reads it.
    """

    pattern: re.Pattern[str]
    key: Callable[[re.Match[str]], str]
    fix: Callable[[re.Match[str]], str]
    settle: Callable[[re.Match[str], DictConfig], Any]


def _section(name: str) -> str:
    """verl names the actor's section ``actor`` in its messages and every other by its full key."""
    return name if name.startswith("actor_rollout_ref") else "actor_rollout_ref.actor"


_KNOWN_ERRORS = (
    _KnownError(
        re.compile(r"Please set at least one of '([\w.]+)\.(\w+)' or '[\w.]+_per_gpu'"),
        key=lambda m: f"{_section(m[1])}.{m[2]}_per_gpu",
        fix=lambda m: (
            f"Set {_section(m[1])}.{m[2]}_per_gpu (e.g. 4), or actor_rollout_ref.actor."
            "use_dynamic_bsz=true with ppo_max_token_len_per_gpu."
        ),
        settle=lambda m, _: 1,
    ),
    _KnownError(
        re.compile(r"You have set both '([\w.]+)\.(\w+)' AND"),
        key=lambda m: f"{_section(m[1])}.{m[2]}",
        fix=lambda m: (
            f"Remove {_section(m[1])}.{m[2]} (deprecated), or set {_section(m[1])}.{m[2]}_per_gpu=null to keep it."
        ),
        settle=lambda m, _: None,
    ),
    _KnownError(
        re.compile(r"real_train_batch_size \(\d+\) must be divisible by minimal possible batch size \((\d+)\)"),
        key=lambda m: "data.train_batch_size",
        fix=lambda m: (
            f"verl splits each step's responses evenly across data-parallel ranks: set "
            f"data.train_batch_size and actor_rollout_ref.rollout.n so that their product is a "
            f"multiple of {m[1]}."
        ),
        settle=lambda m, config: int(_get(config, "data.train_batch_size")) * int(m[1]),
    ),
)


def _known_error(text: str) -> tuple[_KnownError, re.Match[str]] | None:
    for known in _KNOWN_ERRORS:
        match = known.pattern.search(text)
        if match:
            return known, match
    return None


def _verl_message(err: BaseException) -> str:
    """The innermost message of verl's error (Hydra wraps a failing config class in InstantiationException), with
    the fix added where verl's message lacks one."""
    while err.__cause__ is not None or err.__context__ is not None:
        inner = err.__cause__ or err.__context__
        if inner is None or isinstance(inner, KeyboardInterrupt):
            break
        err = inner
    text = one_line(err) or type(err).__name__
    found = _known_error(text)
    fix = found[0].fix(found[1]) if found else ""
    return f"{text} {fix}" if fix else text


_MAX_PASSES = len(_KNOWN_ERRORS) * 3  # each known error at most once per section verl checks


def validate_config_problems(config: DictConfig) -> list[Problem]:
    """verl's own ``validate_config`` (batch sizes across GPUs, micro-batch settings): every problem it finds.

    verl stops at its first error. When that error is one of :data:`_KNOWN_ERRORS` it is reported, settled in a
    scratch copy of the config, and verl's check runs again, so independent problems are all reported at once. Any
    other error ends the passes, and its line says that verl's later checks did not run.
    """
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.utils.config import validate_config

    known, scratch, problems = KnownKeys.of(config), copy.deepcopy(config), []
    for _ in range(_MAX_PASSES):
        try:
            # use_critic=False: a critic's config class loads the critic's model; no DAPO recipe has a critic
            validate_config(config=scratch, use_reference_policy=need_reference_policy(scratch), use_critic=False)
            return problems
        except Exception as err:  # verl raises AssertionError, ValueError or Hydra's InstantiationException
            problem = _class_problem(
                "actor_rollout_ref.actor", err, known, prefix="verl's validate_config refuses the config"
            )
            found = _known_error(_verl_message(err))
            if found is None or any(p.key == problem.key for p in problems):
                note = " verl's validate_config stops at this error: run the check again once it is fixed."
                return [*problems, Problem(problem.key, problem.message + note)]
            problems.append(problem)
            OmegaConf.update(scratch, problem.key, found[0].settle(found[1], scratch), merge=False)
    return problems


def config_classes(config: DictConfig) -> list[Problem]:
    """Each section verl builds a config class from at start-up, built the same way (the model's only typed)."""
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass

    known = KnownKeys.of(config)
    sections = [
        "actor_rollout_ref.actor",
        "actor_rollout_ref.rollout",
        "actor_rollout_ref.rollout.checkpoint_engine",
        "algorithm",
        *(["actor_rollout_ref.ref"] if need_reference_policy(config) else []),
    ]
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
        return Problem(
            f"{section}._target_",
            f"{section}._target_={node._target_!r} cannot be imported ({err}). Keep the config's _target_.",
        )
    if not is_dataclass(cls):
        return None
    try:
        OmegaConf.merge(OmegaConf.structured(cls), node)
    except Exception as err:  # OmegaConf's validation errors: unknown key, wrong type
        return _class_problem(section, err, known)
    return None


_UNKNOWN_FIELD = re.compile(
    r"Key '(\w+)' not in '(\w+)'"
    r"|(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'"
)
_FULL_KEY = re.compile(r"full_key: ([\w.]+)")


def _class_problem(section: str, err: BaseException, known: KnownKeys, *, prefix: str = "") -> Problem:
    """One line for an error of verl's config classes: an unknown key with the closest known one, else verl's text."""
    text = _verl_message(err)
    full, found = _FULL_KEY.search(one_line(err)), _known_error(text)
    key = found[0].key(found[1]) if found else (full.group(1) if full else section)
    key = key if key.startswith(section) or "." in key else f"{section}.{key}"
    unknown = _UNKNOWN_FIELD.search(one_line(err))
    if unknown:
        field_name, cls = (
            (unknown.group(1), unknown.group(2)) if unknown.group(1) else (unknown.group(4), unknown.group(3))
        )
        key = key if key.endswith(f".{field_name}") else f"{key}.{field_name}"
        others = KnownKeys(known.leaves - {key}, known.nodes - {key}, known.values)
        return Problem(
            key,
            f"{key} is not a field of verl's {cls}, which verl builds from {key.rsplit('.', 1)[0]} at "
            f"start-up and which refuses unknown keys; {others.hint(key)} Remove it or correct it.",
        )
    return Problem(key, f"{prefix or f'verl refuses {section} when it builds its config class'}: {text}")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """verl's checks print their progress ("All configuration checks passed") and its imports warn about engines
    this machine lacks; keep the caller's output clean."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
