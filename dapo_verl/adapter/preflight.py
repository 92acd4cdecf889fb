"""The verl half of the pre-flight check: what verl and dapo_verl's verl pieces refuse at start-up.

:func:`check_verl_config` is the one validation of a composed verl config. ``python -m dapo_verl.main`` runs it
before Hydra starts the job (so the recipes' dry runs, ``--cfg job``, run it too) and again in
:func:`dapo_verl.main.run_dapo`; ``dapo-verl doctor CONFIG_NAME`` and ``dapo-verl rehearse`` run it on the
config composed by :func:`dapo_verl.rehearsal.run.compose_recipe`, whose overrides went through
:func:`dapo_verl.preflight.compose_checked` (grammar, deletions, unknown keys). Nothing is started: verl is
imported, no Ray, no worker, no model. Each group of checks reports every problem it finds, one line each
(:class:`~dapo_verl.preflight.Problem`), and :attr:`Findings.checked` says which groups ran:

* ``dapo_verl settings``: every DAPO key (:class:`~dapo_verl.config.DapoConfig`) for ``python -m dapo_verl.main``;
  for ``verl.trainer.main_ppo`` the parts its components read (the ``dapo`` loss's clip settings, the ``dapo``
  estimator's, the ``dapo_verl`` reward manager's overlong settings);
* ``DAPO entry point``: what :func:`dapo_verl.main.run_dapo` needs (its v1 sampler and checkpoint callback, a
  group size of at least 2, no colocated reward model under dynamic sampling, no ReMax);
* ``registered names``: the policy loss, advantage estimator, reward manager, rollout engine and v1 trainer
  mode exist in verl's registries (dapo_verl's registered), with the closest name for a typo;
* ``verl's config classes``: every section verl turns into a config class at start-up (actor, rollout and
  its checkpoint engine, algorithm, reference policy) is turned into it the same way (``omega_conf_to_dataclass``),
  so unknown keys and each class's ``__post_init__`` checks are verl's own; the model section's keys and types
  are checked against its class without running it (it loads the tokenizer);
* ``verl's validate_config``: verl's own start-up check (``verl.utils.config.validate_config``: batch sizes
  divisible across GPUs, micro-batch settings, the actor config's ``validate``), once the sections above pass.
  The critic is not checked: its config class loads the critic's model, and no DAPO recipe has a critic;
* ``data keys``: the lengths and batch sizes verl's data loader reads are positive integers;
* ``reward settings and filter metric``: the ``dapo_verl`` reward manager reads every ``reward.reward_kwargs``
  key given (another would be ignored), and dynamic sampling filters on a value the reward manager reports.

A value read from an environment variable that is not set here (``${oc.env:DAPO_MODEL_PATH}``) is reported in
:attr:`Findings.unset` and checked as a placeholder; it is a problem only when ``unset_env_is_problem``.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import io
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, is_dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from dapo_verl.config import (
    AdvantageConfig,
    DapoConfig,
    LossConfig,
    OverlongConfig,
    clip_higher_inert_reason,
    iter_verl_fields,
    read_verl_section,
)
from dapo_verl.preflight import ConfigRefused, KnownKeys, Problem, one_line

__all__ = ["DAPO_ENTRY", "V1_CHECKPOINT_CALLBACK", "V1_SAMPLER", "VERL_ENTRY", "Findings", "check_verl_config",
           "clip_higher_warning", "compose_and_check", "dapo_entry_problems", "load_verl_checks",
           "verl_config_problems"]

DAPO_ENTRY = "dapo_verl.main"
VERL_ENTRY = "verl.trainer.main_ppo"
V1_SAMPLER = ("pkg://dapo_verl.adapter.v1_sampler", "DapoReplayBuffer")
V1_CHECKPOINT_CALLBACK = "dapo_verl.adapter.v1_sampler.DapoCheckpointCallback"

_REPORTED_BY_DAPO_VERL = ("acc", "score", "pred", "overlong_penalty", "overlong", "truncated", "response_length")
"""Per-response values the dapo_verl reward manager reports with verl's default score function (math_dapo)."""
_SHAPED = ("seq_reward", "seq_final_reward")
"""Names of the shaped reward the legacy trainer's filter understands (the rollout's ``rm_scores``)."""

_VERL_SECTIONS = ("actor_rollout_ref.", "algorithm.", "critic.")
_VERL_REWARD_KWARGS = ("overlong_buffer_cfg", "max_resp_len")
"""verl's own names for the overlong settings, which the dapo_verl reward manager reads as aliases of its own."""
_POSITIVE_DATA_KEYS = ("data.max_prompt_length", "data.max_response_length", "data.train_batch_size")


@dataclass
class Findings:
    """What :func:`verl_config_problems` found.

    Attributes:
        problems: One per thing a run would refuse.
        checked: The groups of checks that ran (see the module docstring), in order.
        unset: ``key (reads $VAR)`` for each value whose environment variable is not set here.
    """

    problems: list[Problem] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)


def check_verl_config(config: DictConfig, *, entry_module: str, unset_env_is_problem: bool = True) -> Findings:
    """Run :func:`verl_config_problems` and raise if it found anything.

    Raises:
        ConfigRefused: with one problem per line.
    """
    findings = verl_config_problems(config, entry_module=entry_module, unset_env_is_problem=unset_env_is_problem)
    if findings.problems:
        raise ConfigRefused(findings.problems)
    return findings


def load_verl_checks() -> None:
    """Import what the checks use of verl (its registries, config classes and validate_config) -- ten seconds or
    more on a busy machine -- so that a caller timing the checks times the checks."""
    _registries()
    import verl.trainer.ppo.utils
    import verl.utils.config  # noqa: F401


def compose_and_check(compose: Callable[[], DictConfig], *, entry_module: str,
                      unset_env_is_problem: bool = True) -> tuple[DictConfig, Findings]:
    """Compose (:func:`dapo_verl.preflight.compose_config_dir` or the like) and check; report every problem at once.

    When the overrides themselves are refused, the rest of the config (composed without them) is checked too, so
    one run of ``doctor`` or of the dry run lists everything to fix.

    Raises:
        ConfigRefused: with every problem found.
    """
    try:
        config, early = compose(), []
    except ConfigRefused as refused:
        if refused.config is None:
            raise
        config, early = refused.config, refused.problems
    findings = verl_config_problems(config, entry_module=entry_module, unset_env_is_problem=unset_env_is_problem)
    findings.problems = [*early, *(p for p in findings.problems if not _reported(p, {e.key for e in early}))]
    if findings.problems:
        raise ConfigRefused(findings.problems)
    return config, findings


def verl_config_problems(config: DictConfig, *, entry_module: str, unset_env_is_problem: bool = True) -> Findings:
    """Every problem verl or dapo_verl would raise at start-up for ``config`` run through ``entry_module``.

    Args:
        config: A composed verl config (not modified).
        entry_module: :data:`DAPO_ENTRY` or :data:`VERL_ENTRY`.
        unset_env_is_problem: Whether a value read from an unset environment variable is a problem (a real run)
            or only noted in :attr:`Findings.unset` (a dry run, ``doctor``, a rehearsal, which replaces paths).
    """
    findings = Findings()
    plain, unset, broken = _resolvable(config)
    findings.unset = [f"{key} (reads ${variable})" for key, variable in unset]
    if unset_env_is_problem:
        findings.problems += [Problem(key, f"{key} reads the environment variable {variable}, which is not set; the "
                                           f"run cannot resolve it. Export {variable}.") for key, variable in unset]
    findings.problems += broken
    dapo_run = entry_module == DAPO_ENTRY
    groups: list[tuple[str, Callable[[DictConfig], list[Problem]]]] = [
        ("dapo_verl settings", _dapo_settings if dapo_run else _component_settings),
        *([("DAPO entry point", _entry_problems)] if dapo_run else []),
        ("data keys", _data_keys),
        ("registered names", _registered_names),
        ("reward settings and filter metric", _reward_and_filter),
        ("verl's config classes", _verl_config_classes),
        ("verl's validate_config", _verl_validate_config),
    ]
    with _quiet():
        _run_groups(groups, plain, findings)
    return findings


def _run_groups(groups: Sequence[tuple[str, Callable[[DictConfig], list[Problem]]]], plain: DictConfig,
                findings: Findings) -> None:
    for name, check in groups:
        if name == "verl's validate_config" and any(p.key.startswith(_VERL_SECTIONS) for p in findings.problems):
            continue  # verl's cross-checks assume sections its config classes accept
        seen = {p.key for p in findings.problems}
        findings.problems += [p for p in check(plain) if not _reported(p, seen)]
        findings.checked.append(name)


def _reported(problem: Problem, seen: set[str]) -> bool:
    """Whether ``problem`` repeats one already found: the same key, or a section's error about a key found in it."""
    return any(key == problem.key or (key.startswith(problem.key + ".") and key.rsplit(".", 1)[1] in problem.message)
               for key in seen)


# -- resolving ----------------------------------------------------------------------------------------------

_ENV = re.compile(r"Environment variable '(\w+)' not found")


def _resolvable(config: DictConfig) -> tuple[DictConfig, list[tuple[str, str]], list[Problem]]:
    """A resolved copy of ``config``, a placeholder for each value whose environment variable is unset.

    Returns:
        ``(copy, unset, broken)``: the copy (unresolved when some interpolation cannot resolve), ``(key,
        variable)`` for each value read from an unset environment variable, and one problem per other
        interpolation that cannot be resolved.
    """
    copy = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    unset, broken = [], []
    for key, value in sorted(KnownKeys.of(copy).values.items()):
        if not _interpolates(value):
            continue  # most values are plain: only interpolations can fail to resolve
        try:
            _touch(OmegaConf.select(copy, key, throw_on_resolution_failure=True))
        except Exception as err:  # OmegaConf's resolution errors share no narrower base with a resolver's own
            variable = _ENV.search(str(err))
            if variable:
                unset.append((key, variable.group(1)))
                OmegaConf.update(copy, key, f"<unset ${variable.group(1)}>", merge=False)
            else:
                broken.append(Problem(key, f"{key}={value!r} cannot be resolved ({one_line(err)[:200]}). Fix the "
                                           f"interpolation or set the value directly."))
    if broken:
        return copy, unset, broken
    return OmegaConf.create(OmegaConf.to_container(copy, resolve=True, throw_on_missing=False)), unset, broken


def _interpolates(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, list | tuple):
        return any(_interpolates(v) for v in value)
    return isinstance(value, dict) and any(_interpolates(v) for v in value.values())


def _touch(value: Any) -> None:
    if isinstance(value, DictConfig | ListConfig):
        OmegaConf.to_container(value, resolve=True)


# -- dapo_verl's own settings ---------------------------------------------------------------------------------


def _problem_from(err: Exception, default_key: str) -> Problem:
    text = one_line(err)
    match = re.match(r"^([A-Za-z_][\w.]*)=", text)
    return Problem(match.group(1) if match else default_key, text)


def _dapo_settings(config: DictConfig) -> list[Problem]:
    try:
        DapoConfig.from_verl(config)
    except (ValueError, TypeError) as err:
        return [_problem_from(err, "dapo_verl")]
    return []


def _component_settings(config: DictConfig) -> list[Problem]:
    """For ``verl.trainer.main_ppo``: the settings of the dapo_verl components the config names."""
    from dapo_verl.adapter.reward import reward_settings

    parts: list[tuple[bool, Callable[[], Any]]] = [
        (_get(config, "actor_rollout_ref.actor.policy_loss.loss_mode") == "dapo",
         lambda: read_verl_section(LossConfig, config)),
        (_get(config, "algorithm.adv_estimator") == "dapo", lambda: read_verl_section(AdvantageConfig, config)),
        (_get(config, "reward.reward_manager.name") == "dapo_verl", lambda: reward_settings(config)),
    ]
    problems = []
    for used, read in parts:
        if used:
            try:
                read()
            except (ValueError, TypeError) as err:
                problems.append(_problem_from(err, "dapo_verl"))
    return problems


def dapo_entry_problems(config: DictConfig, dapo: DapoConfig) -> list[Problem]:
    """What ``python -m dapo_verl.main`` itself refuses, beyond the values of the DAPO keys."""
    problems = []
    if config.trainer.get("use_v1", False):
        problems += _v1_sampler_problems(config)
    reward_model = config.reward.get("reward_model", {}) or {}
    colocated = reward_model.get("enable", False) and not reward_model.get("enable_resource_pool", False)
    if dapo.sampler.enable and colocated:
        problems.append(Problem("reward.reward_model.enable", (
            "reward.reward_model.enable=true with reward.reward_model.enable_resource_pool=false: a colocated reward "
            "model scores responses only after generation, so dynamic sampling cannot read "
            f"algorithm.filter_groups.metric={dapo.sampler.metric} while it samples. Give the reward model its own "
            "GPUs (reward.reward_model.enable_resource_pool=true), use a rule-based reward, or set "
            "algorithm.filter_groups.enable=false.")))
    n = config.actor_rollout_ref.rollout.n
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        problems.append(Problem("actor_rollout_ref.rollout.n", (
            f"actor_rollout_ref.rollout.n={n!r}: group-normalised advantages need >= 2 responses per prompt. Set "
            f"actor_rollout_ref.rollout.n (the paper uses 16).")))
    if config.algorithm.adv_estimator == "remax":
        problems.append(Problem("algorithm.adv_estimator", (
            "algorithm.adv_estimator=remax needs a greedy baseline rollout per prompt, which the batch replenisher "
            "does not produce. Use adv_estimator=dapo or grpo.")))
    return problems


def clip_higher_warning(config: DictConfig, dapo: DapoConfig) -> None:
    """Warn once when clip-higher cannot act under the config's batching (it is not an error)."""
    actor = config.actor_rollout_ref.actor
    reason = clip_higher_inert_reason(train_batch_size=dapo.sampler.train_batch_size,
                                      ppo_mini_batch_size=actor.ppo_mini_batch_size, ppo_epochs=actor.ppo_epochs)
    if reason and dapo.loss.clip_ratio_high != dapo.loss.clip_ratio_low:
        warnings.warn(reason, stacklevel=3)


def _entry_problems(config: DictConfig) -> list[Problem]:
    try:
        dapo = DapoConfig.from_verl(config)
    except (ValueError, TypeError):  # reported by _dapo_settings
        return []
    return dapo_entry_problems(config, dapo)


def _v1_sampler_problems(config: DictConfig) -> list[Problem]:
    problems = []
    sampler = (config.trainer.get("v1", {}) or {}).get("sampler", {}).get("custom_sampler") or {}
    if (sampler.get("path"), sampler.get("name")) != V1_SAMPLER:
        problems.append(Problem("trainer.v1.sampler.custom_sampler", (
            f"trainer.v1.sampler.custom_sampler is {{path: {sampler.get('path')}, name: {sampler.get('name')}}}; "
            f"python -m dapo_verl.main runs dapo_verl's batch replenisher as v1's sampler ({{path: {V1_SAMPLER[0]}, "
            f"name: {V1_SAMPLER[1]}}}, as dapo/base.yaml sets). To use verl's built-in filter_groups instead, run "
            f"python -m verl.trainer.main_ppo with loss_mode=dapo.")))
    if config.trainer.get("checkpoint_callback_class") != V1_CHECKPOINT_CALLBACK:
        problems.append(Problem("trainer.checkpoint_callback_class", (
            f"trainer.checkpoint_callback_class={config.trainer.get('checkpoint_callback_class')!r}: without "
            f"{V1_CHECKPOINT_CALLBACK} the sampler's state (prompt history, carried groups, counters) is not saved "
            f"and a resumed run would repeat or lose groups. Keep dapo/base.yaml's value.")))
    return problems


# -- keys verl reads ------------------------------------------------------------------------------------------


def _get(config: DictConfig, key: str) -> Any:
    return OmegaConf.select(config, key, default=None)


def _data_keys(config: DictConfig) -> list[Problem]:
    problems = []
    for key in _POSITIVE_DATA_KEYS:
        value = _get(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(Problem(key, f"{key}={value!r} must be a positive integer; verl's data loader and "
                                         f"trainer size batches and sequences by it. Set {key} to a whole number."))
    gen = _get(config, "data.gen_batch_size")
    if gen is not None and (isinstance(gen, bool) or not isinstance(gen, int) or gen < 1):
        problems.append(Problem("data.gen_batch_size", f"data.gen_batch_size={gen!r} must be a positive integer or "
                                                       f"null (train_batch_size). Set it to a number of prompts."))
    return problems


def _registries() -> dict[str, Sequence[str]]:
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


def _registered_names(config: DictConfig) -> list[Problem]:
    problems = []
    for key, known in _registries().items():
        if key == "reward.reward_manager.name" and _get(config, "reward.reward_manager.source") == "importlib":
            continue  # a class loaded from reward.reward_manager.module.path, not a registered name
        if key == "trainer.v1.trainer_mode" and not _get(config, "trainer.use_v1"):
            continue
        value = _get(config, key)
        if value in known:
            continue
        close = difflib.get_close_matches(str(value), known, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]}?" if close else ""
        shown = "is not set" if value is None else f"={value!r} is not registered in verl"
        problems.append(Problem(key, f"{key}{shown} (known: {', '.join(known)}); verl looks it up at start-up and "
                                     f"fails.{hint} Set {key} to one of the known names."))
    return problems


def _reward_and_filter(config: DictConfig) -> list[Problem]:
    return _reward_kwargs(config) + _filter_metric(config)


def _reward_kwargs(config: DictConfig) -> list[Problem]:
    """The dapo_verl reward manager reads only its own ``reward.reward_kwargs``; any other key would be ignored."""
    kwargs = _get(config, "reward.reward_kwargs")
    if _get(config, "reward.reward_manager.name") != "dapo_verl" or not isinstance(kwargs, DictConfig):
        return []
    prefix = "reward.reward_kwargs."
    known = KnownKeys.of({"reward": {"reward_kwargs": {
        **{key[len(prefix):]: None for key, _ in iter_verl_fields(OverlongConfig) if key.startswith(prefix)},
        **dict.fromkeys(_VERL_REWARD_KWARGS)}}})
    return [Problem(prefix + name, f"{prefix}{name} is not read by the dapo_verl reward manager, so the run would "
                                   f"ignore it; {known.hint(prefix + name)} It reads "
                                   f"{', '.join(sorted(k[len(prefix):] for k in known.leaves))}.")
            for name in kwargs if prefix + name not in known]


def _filter_metric(config: DictConfig) -> list[Problem]:
    if not _get(config, "algorithm.filter_groups.enable"):
        return []
    metric = _get(config, "algorithm.filter_groups.metric")
    manager = _get(config, "reward.reward_manager.name")
    custom = _get(config, "reward.custom_reward_function.path") or _get(config, "custom_reward_function.path")
    if manager != "dapo_verl" or custom or metric in (*_REPORTED_BY_DAPO_VERL, *_SHAPED) or metric is None:
        return []
    return [Problem("algorithm.filter_groups.metric", (
        f"algorithm.filter_groups.metric={metric!r} is not a value the dapo_verl reward manager reports (it reports "
        f"{', '.join(_REPORTED_BY_DAPO_VERL)} with verl's default score function), so dynamic sampling would fail "
        f"at its first batch. Set algorithm.filter_groups.metric=acc (raw correctness)."))]


# -- verl's own checks ----------------------------------------------------------------------------------------


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


def _verl_validate_config(config: DictConfig) -> list[Problem]:
    from verl.trainer.ppo.utils import need_reference_policy
    from verl.utils.config import validate_config

    try:
        # use_critic=False: a critic's config class loads the critic's model; no DAPO recipe has a critic
        validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=False)
    except Exception as err:  # verl raises AssertionError, ValueError or Hydra's InstantiationException
        return [_class_problem("actor_rollout_ref.actor", err, KnownKeys.of(config),
                               prefix="verl's validate_config refuses the config")]
    return []


def _verl_config_classes(config: DictConfig) -> list[Problem]:
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
def _quiet() -> Iterator[None]:
    """verl's checks print their progress ("All configuration checks passed") and its imports warn about engines
    this machine lacks; keep the caller's output clean."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
