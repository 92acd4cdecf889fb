"""The verl half of the pre-flight check: what verl and dapo_verl's verl pieces refuse at start-up.

:func:`check_verl_config` is the one validation of a composed verl config. ``python -m dapo_verl.main`` runs it
before Hydra starts the job (so the recipes' dry runs, ``--cfg job``, run it too) and again in
:func:`dapo_verl.main.run_dapo`; ``dapo-verl doctor CONFIG_NAME`` and ``dapo-verl rehearse`` run it on the
config composed by :func:`dapo_verl.rehearsal.recipe.compose_recipe`, whose overrides went through
:func:`dapo_verl.preflight.compose_checked` (grammar, deletions, unknown keys). Nothing is started: verl is
imported, no Ray, no worker, no model. Each group of checks reports every problem it finds, one line each
(:class:`~dapo_verl.preflight.Problem`), and :attr:`Findings.checked` says which groups ran, in this order:

* ``dapo_verl settings`` (:mod:`.preflight_dapo`): every DAPO key (:class:`~dapo_verl.config.DapoConfig`) for
  ``python -m dapo_verl.main``; for ``verl.trainer.main_ppo`` the parts its components read (the ``dapo`` loss's
  clip settings, the ``dapo`` estimator's, the ``dapo_verl`` reward manager's overlong settings);
* ``DAPO entry point`` (:mod:`.preflight_dapo`): what :func:`dapo_verl.main.run_dapo` needs (its v1 sampler and
  checkpoint callback, a group size of at least 2, no colocated reward model under dynamic sampling, no ReMax);
* ``data keys`` (:mod:`.preflight_dapo`): the lengths and batch sizes verl's data loader reads are positive
  integers;
* ``registered names`` (:mod:`.preflight_verl`): the policy loss, advantage estimator, reward manager, rollout
  engine and v1 trainer mode exist in verl's registries (dapo_verl's registered), with the closest name for a
  typo;
* ``reward settings and filter metric`` (:mod:`.preflight_dapo`): the ``dapo_verl`` reward manager reads every
  ``reward.reward_kwargs`` key given (another would be ignored), and dynamic sampling filters on a value the
  reward manager reports;
* ``rollout engine settings`` (:mod:`.engine_ranges`): the values verl hands vLLM (``gpu_memory_utilization``,
  ``max_num_seqs``, ``max_num_batched_tokens``, tensor parallelism, ``dtype``, ... and ``engine_kwargs.vllm``)
  are inside vLLM's own ranges, which vLLM checks only once the run has started; for every engine,
  ``max_model_len`` holds ``prompt_length + response_length``;
* ``verl's config classes`` (:mod:`.preflight_verl`): every section verl turns into a config class at start-up
  (actor, rollout and its checkpoint engine, algorithm, reference policy) is turned into it the same way
  (``omega_conf_to_dataclass``), so unknown keys and each class's ``__post_init__`` checks are verl's own; the
  model section's keys and types are checked against its class without running it (it loads the tokenizer);
* ``verl's validate_config`` (:mod:`.preflight_verl`): verl's own start-up check
  (``verl.utils.config.validate_config``: batch sizes divisible across GPUs, micro-batch settings, the actor
  config's ``validate``), once the sections above pass. The critic is not checked: its config class loads the
  critic's model, and no DAPO recipe has a critic.

A value read from an environment variable that is not set here (``${oc.env:DAPO_MODEL_PATH}``) is reported in
:attr:`Findings.unset` and checked as a placeholder; it is a problem only when ``unset_env_is_problem``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from dapo_verl.adapter.engine_ranges import engine_problems
from dapo_verl.adapter.preflight_dapo import (
    component_settings,
    dapo_entry_problems,
    data_keys,
    read_dapo,
    reward_and_filter,
)
from dapo_verl.adapter.preflight_verl import (
    config_classes,
    quiet,
    registered_names,
    registries,
    validate_config_problems,
)
from dapo_verl.config import DapoConfig
from dapo_verl.preflight import ConfigRefused, KnownKeys, Problem, one_line

__all__ = [
    "DAPO_ENTRY",
    "VERL_ENTRY",
    "Findings",
    "check_verl_config",
    "compose_and_check",
    "load_verl_checks",
    "verl_config_problems",
]

DAPO_ENTRY = "dapo_verl.main"
VERL_ENTRY = "verl.trainer.main_ppo"


@dataclass
class Findings:
    """What :func:`verl_config_problems` found.

    Attributes:
        problems: One per thing a run would refuse.
        checked: The groups of checks that ran (see the module docstring), in order.
        unset: ``key (reads $VAR)`` for each value whose environment variable is not set here.
        dapo: The DAPO section, parsed once (:data:`DAPO_ENTRY` only; None where it could not be read).
    """

    problems: list[Problem] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    unset: list[str] = field(default_factory=list)
    dapo: DapoConfig | None = None


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
    with quiet():
        registries()
        import verl.trainer.ppo.utils
        import verl.utils.config  # noqa: F401


def compose_and_check(
    compose: Callable[[], DictConfig], *, entry_module: str, unset_env_is_problem: bool = True
) -> tuple[DictConfig, Findings]:
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
        findings.problems += [
            Problem(
                key,
                f"{key} reads the environment variable {variable}, which is not set; the "
                f"run cannot resolve it. Export {variable}.",
            )
            for key, variable in unset
        ]
    findings.problems += broken
    dapo_run = entry_module == DAPO_ENTRY

    def dapo_settings(plain: DictConfig) -> list[Problem]:
        findings.dapo, problems = read_dapo(plain)
        return problems

    def entry_problems(plain: DictConfig) -> list[Problem]:  # once the DAPO keys can be read (reported otherwise)
        return [] if findings.dapo is None else dapo_entry_problems(plain, findings.dapo)

    groups: list[tuple[str, Callable[[DictConfig], list[Problem]]]] = [
        ("dapo_verl settings", dapo_settings if dapo_run else component_settings),
        *([("DAPO entry point", entry_problems)] if dapo_run else []),
        ("data keys", data_keys),
        ("registered names", registered_names),
        ("reward settings and filter metric", reward_and_filter),
        ("rollout engine settings", engine_problems),
        ("verl's config classes", config_classes),
        ("verl's validate_config", validate_config_problems),
    ]
    with quiet():
        _run_groups(groups, plain, findings)
    return findings


def _run_groups(
    groups: Sequence[tuple[str, Callable[[DictConfig], list[Problem]]]], plain: DictConfig, findings: Findings
) -> None:
    for name, check in groups:
        seen = {p.key for p in findings.problems}
        try:
            found = check(plain)
        except Exception as err:  # a config shaped unlike any verl config (a section set to a number, ...)
            found = [
                Problem(
                    name,
                    f"The check of {name} could not read the config ({type(err).__name__}: "
                    f"{one_line(err)[:200]}); a section it reads is missing or is not a section. "
                    f"Compare the config with `python -m dapo_verl.main --cfg job`.",
                )
            ]
        findings.problems += [p for p in found if not _reported(p, seen)]
        findings.checked.append(name)


def _reported(problem: Problem, seen: set[str]) -> bool:
    """Whether ``problem`` repeats one already found: the same key, or a section's error about a key found in it."""
    return any(
        key == problem.key or (key.startswith(problem.key + ".") and key.rsplit(".", 1)[1] in problem.message)
        for key in seen
    )


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
                broken.append(
                    Problem(
                        key,
                        f"{key}={value!r} cannot be resolved ({one_line(err)[:200]}). Fix the "
                        f"interpolation or set the value directly.",
                    )
                )
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
