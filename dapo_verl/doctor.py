"""``dapo-verl doctor``: does verl see dapo_verl's registrations, and if not, why not.

verl loads plugins inside ``import verl`` and swallows their errors, so a broken install shows up only as
``Unknown policy loss: dapo`` deep inside a Ray worker. The doctor checks, in order: the installed verl
version against dapo-verl's own requirement on verl (read from its installed metadata and judged as ``pip check``
judges it, so the two never disagree), the ``verl.plugins`` entry point, the ``VERL_USE_EXTERNAL_PLUGINS``
policy, what a *fresh* process sees after ``import verl`` (as a Ray worker would), and -- if something is
missing -- imports the registration module directly so the hidden exception is shown.

``dapo-verl doctor CONFIG_NAME [KEY=VALUE ...]`` also runs the pre-flight check every entry point runs
(:func:`config_checks`, :mod:`dapo_verl.adapter.preflight`): one ``[FAIL]`` line per problem a run would refuse,
``[ok]`` for each group of checks that passed, and then, for a config that passed, which trainer, sampler, loss,
estimator and reward manager it runs (``[info]``: described, not checked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, entry_points, requires, version
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion

from dapo_verl.adapter.preflight import DAPO_ENTRY, VERL_ENTRY, compose_and_check
from dapo_verl.adapter.preflight_dapo import dapo_entry_problems
from dapo_verl.config import DapoConfig, PromptSelection, SamplerConfig
from dapo_verl.lifetime import dying_with_this_process
from dapo_verl.preflight import ConfigRefused

__all__ = ["Check", "VerlPin", "config_checks", "describe_run", "run_checks", "verl_pin"]

ENTRY_POINT_GROUP = "verl.plugins"
ENTRY_POINT_NAME = "dapo"
ENTRY_POINT_TARGET = "dapo_verl.adapter.register"
DISTRIBUTION = "dapo-verl"

# Reads verl's registries without importing dapo_verl (which would register by itself and hide the problem).
_FRESH_PROCESS = """
import json, sys
import verl
from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
loss, estimator, manager = sys.argv[1:4]
print(json.dumps({
    f"policy loss {loss!r}": loss in POLICY_LOSS_REGISTRY,
    f"advantage estimator {estimator!r}": estimator in ADV_ESTIMATOR_REGISTRY,
    f"reward manager {manager!r}": manager in REWARD_MANAGER,
}))
"""
_NAMES = ("dapo", "dapo", "dapo_verl")  # adapter/register.py's names; a test keeps the two in step


@dataclass(frozen=True)
class Check:
    """One doctor finding: ``ok`` and a message; ``fix`` says what to do when not ok.

    ``checked`` is False for what the doctor only describes (which trainer and sampler run) or could not check;
    ``dapo-verl doctor`` prints ``[ok]`` only for findings that were checked and passed.
    """

    name: str
    ok: bool
    message: str
    fix: str = ""
    checked: bool = True

    @property
    def tag(self) -> str:
        """``[ok]``, ``[FAIL]`` or, for what was not checked, ``[info]``."""
        return "[FAIL]" if not self.ok else "[ok]" if self.checked else "[info]"


@dataclass(frozen=True)
class VerlPin:
    """dapo-verl's requirement on verl: its version range and the extras it installs verl with."""

    specifier: SpecifierSet
    extras: tuple[str, ...]

    @property
    def range(self) -> str:
        """The range as written in pyproject.toml, lower bound first (``>=0.9.1,<0.10``)."""
        return ",".join(sorted((str(s) for s in self.specifier), key=lambda s: (not s.startswith(">"), s)))

    @property
    def install(self) -> str:
        """The pip command that installs a verl inside the range."""
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f'pip install "verl{extras}{self.range}"'

    def admits(self, installed: str) -> bool:
        """Whether ``installed`` satisfies the range as ``pip check`` judges it (pre-releases compared, not
        excluded; by PEP 440 ``0.10.0.dev0`` does not satisfy ``<0.10``)."""
        return self.specifier.contains(installed, prereleases=True)


def verl_pin() -> VerlPin:
    """dapo-verl's requirement on verl, read from its installed metadata as ``pip check`` reads it.

    The requirements on verl that apply without extras (pip evaluates markers with ``extra=""``) are combined.

    Raises:
        PackageNotFoundError: when dapo-verl is not installed (a source checkout on ``PYTHONPATH``).
        RuntimeError: when the installed metadata states no requirement on verl.
    """
    pins = [
        req
        for req in map(Requirement, requires(DISTRIBUTION) or [])
        if canonicalize_name(req.name) == "verl" and (req.marker is None or req.marker.evaluate({"extra": ""}))
    ]
    if not pins:
        raise RuntimeError(
            f"{DISTRIBUTION}'s installed metadata states no requirement on verl, but its "
            "pyproject.toml does; the install is stale or damaged. Reinstall dapo-verl: pip install -e "
            ". in the checkout (or pip install dapo-verl)."
        )
    specifier = SpecifierSet(",".join(str(req.specifier) for req in pins if req.specifier))
    return VerlPin(specifier, tuple(sorted({extra for req in pins for extra in req.extras})))


def _verl_version() -> Check:
    try:
        pin = verl_pin()
    except PackageNotFoundError:
        return Check(
            "verl version",
            False,
            f"{DISTRIBUTION} is not installed in this interpreter, so its "
            "requirement on verl cannot be read (a source checkout on PYTHONPATH is not an install).",
            "pip install -e . in the checkout (or pip install dapo-verl).",
        )
    except RuntimeError as err:
        return Check("verl version", False, str(err))
    try:
        installed = version("verl")
    except PackageNotFoundError:
        return Check(
            "verl installed",
            False,
            "verl is not installed in this interpreter.",
            f"{pin.install} ({DISTRIBUTION} depends on it).",
        )
    try:
        admitted = pin.admits(installed)
    except InvalidVersion:
        return Check(
            "verl version",
            False,
            f"verl {installed!r} is installed, a version PEP 440 cannot parse, so it "
            f"cannot be checked against dapo-verl's requirement verl{pin.range}.",
            pin.install,
        )
    if admitted:
        return Check("verl version", True, f"verl {installed} (dapo-verl requires verl{pin.range}).")
    return Check(
        "verl version",
        False,
        f"verl {installed} is installed, outside the range dapo-verl supports and "
        f"requires, verl{pin.range} (pip check reports the same conflict).",
        pin.install,
    )


def _entry_point() -> Check:
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == ENTRY_POINT_NAME]
    if not found:
        return Check(
            "entry point",
            False,
            f"No '{ENTRY_POINT_NAME}' entry point in group '{ENTRY_POINT_GROUP}'.",
            "Reinstall dapo-verl with pip (an installed package, not a PYTHONPATH checkout).",
        )
    target = found[0].value
    ok = target == ENTRY_POINT_TARGET
    return Check("entry point", ok, f"'{ENTRY_POINT_NAME}' -> {target}.", "" if ok else "Reinstall dapo-verl.")


def _plugin_policy() -> Check:
    policy = os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    allowed = policy == "auto" or ENTRY_POINT_NAME in {p.strip() for p in policy.split(",")}
    return Check(
        "plugin policy",
        allowed,
        f"VERL_USE_EXTERNAL_PLUGINS={policy!r}.",
        ""
        if allowed
        else f"Unset VERL_USE_EXTERNAL_PLUGINS or add '{ENTRY_POINT_NAME}' to it, or use the explicit "
        f"fallback VERL_USE_EXTERNAL_MODULES={ENTRY_POINT_TARGET}.",
    )


def _fresh_process() -> tuple[Check, dict[str, bool]]:
    result = subprocess.run(
        dying_with_this_process([sys.executable, "-c", _FRESH_PROCESS, *_NAMES]),
        check=False,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-1:] or ["(no output)"]
        return Check(
            "fresh process",
            False,
            f"`import verl` in a fresh process failed: {tail[0]}",
            "Fix the error above; verl itself must import.",
        ), {}
    status = json.loads(result.stdout.strip().splitlines()[-1])
    missing = [name for name, ok in status.items() if not ok]
    message = "After `import verl` a fresh process sees " + ", ".join(
        f"{name}: {'yes' if ok else 'NO'}" for name, ok in status.items()
    )
    fix = (
        ""
        if not missing
        else (
            "The plugin did not register. Use the loud fallbacks "
            f"actor_rollout_ref.model.external_lib={ENTRY_POINT_TARGET} or "
            f"VERL_USE_EXTERNAL_MODULES={ENTRY_POINT_TARGET}, and see the import error below."
        )
    )
    return Check("fresh process", not missing, message, fix), status


def _direct_import() -> Check:
    try:
        import dapo_verl.adapter.register  # noqa: F401
    except Exception:  # the whole point: show what verl's plugin loader swallowed
        return Check(
            "direct import",
            False,
            "Importing the registration module raised:\n" + traceback.format_exc(),
            "Fix this error; verl hides it when it loads plugins.",
        )
    return Check("direct import", True, f"{ENTRY_POINT_TARGET} imports cleanly.")


def _vllm() -> Check:
    from dapo_verl.rehearsal.engine import vllm_install_report

    ok, message, fix = vllm_install_report()
    return Check("vllm", ok, message, fix)


def run_checks() -> list[Check]:
    """Run every check in order; the direct import runs only when registration is missing."""
    checks = [_verl_version()]
    if checks[0].name == "verl installed":
        return checks
    checks += [_entry_point(), _plugin_policy(), _vllm()]
    fresh, _ = _fresh_process()
    checks.append(fresh)
    if not fresh.ok:
        checks.append(_direct_import())
    return checks


def config_checks(config_name: str, overrides: Sequence[str]) -> tuple[list[Check], Any, str | None]:
    """The pre-flight check of ``config_name`` with ``overrides`` (:mod:`dapo_verl.adapter.preflight`).

    Returns:
        ``(checks, config, entry_module)``: one failed :class:`Check` per problem, or one passed check naming
        every group of checks that ran (and a note for values read from unset environment variables); the
        composed config and its entry module when it passed, else None for both.

    Raises:
        dapo_verl.rehearsal.run.RehearsalError: for a config name that is neither a recipe nor ``ppo_trainer``.
    """
    from dapo_verl.rehearsal.recipe import VERL_CONFIG, compose_recipe

    entry = VERL_ENTRY if config_name == VERL_CONFIG else DAPO_ENTRY
    try:
        config, findings = compose_and_check(
            lambda: compose_recipe(config_name, overrides)[0], entry_module=entry, unset_env_is_problem=False
        )
    except ConfigRefused as refused:
        return [Check("config", False, problem.message) for problem in refused.problems], None, None
    checks = [Check("config", True, f"{config_name} passes: {', '.join(findings.checked)}.")]
    if findings.unset:
        checks.append(
            Check(
                "config",
                True,
                "not checked here (environment variables unset; the cluster sets them): "
                + ", ".join(findings.unset)
                + ".",
                checked=False,
            )
        )
    return checks, config, entry


def _prompt_choice(sampler: SamplerConfig) -> str:
    """How the replenisher chooses prompts, in one sentence."""
    if not sampler.enable:
        return "in data order (dynamic sampling off)."
    if not sampler.skip_uninformative:
        return "in data order (algorithm.filter_groups.skip_uninformative=false)."
    if sampler.prompt_selection == PromptSelection.STREAK:
        return "in data order, skipping prompts after all-correct or all-wrong streaks (prompt_selection=streak)."
    return (
        f"by their predicted chance of an informative group, the best of {sampler.selection_window:g} candidates "
        f"each, a share {sampler.explore_fraction:g} exploring the least known; rounds sized from the predicted "
        f"yield (prompt_selection=predicted)."
    )


def describe_run(config: Any, entry_module: str) -> list[Check]:
    """Which trainer, sampler, loss, estimator and reward manager ``config`` runs through ``entry_module``.

    Args:
        config: A composed verl config (``dapo-verl doctor CONFIG_NAME [KEY=VALUE ...]`` composes it).
        entry_module: ``dapo_verl.main`` or ``verl.trainer.main_ppo``.
    """
    v1 = bool(config.trainer.get("use_v1", True))
    mode = config.trainer.get("v1", {}).get("trainer_mode", "sync") if v1 else None
    sampler = (config.trainer.get("v1", {}).get("sampler", {}) or {}).get("custom_sampler") or {}
    ours = (sampler.get("path"), sampler.get("name")) == ("pkg://dapo_verl.adapter.v1_sampler", "DapoReplayBuffer")
    filter_groups = bool(config.algorithm.get("filter_groups", {}).get("enable", False))
    checks = []
    if entry_module == DAPO_ENTRY:
        problems = dapo_entry_problems(config, DapoConfig.from_verl(config)) if v1 else []
        sampler_problems = [p for p in problems if p.key.startswith("trainer.")]
        if sampler_problems:
            checks.append(Check("trainer", False, f"verl's v1 trainer ({mode}).", sampler_problems[0].message))
        elif v1:
            checks.append(Check("trainer", True, f"verl's v1 trainer ({mode}), verl's default.", checked=False))
            checks.append(
                Check(
                    "sampler",
                    True,
                    "dapo_verl's batch replenisher as v1's custom sampler "
                    "(DapoReplayBuffer); its state is saved by DapoCheckpointCallback.",
                    checked=False,
                )
            )
        else:
            checks.append(
                Check(
                    "trainer",
                    True,
                    "verl's legacy RayPPOTrainer (trainer.use_v1=false; verl deprecates it and plans to remove it).",
                    checked=False,
                )
            )
            checks.append(
                Check(
                    "sampler",
                    True,
                    "dapo_verl's batch replenisher, driving the legacy trainer's batches (DapoRayTrainer).",
                    checked=False,
                )
            )
        if not sampler_problems:
            checks.append(Check("prompts", True, _prompt_choice(DapoConfig.from_verl(config).sampler), checked=False))
    else:
        checks.append(
            Check(
                "trainer",
                True,
                f"verl's {'v1 trainer (' + str(mode) + ')' if v1 else 'legacy trainer'}.",
                checked=False,
            )
        )
        if v1 and ours:
            message = "dapo_verl's DapoReplayBuffer (set by hand; python -m dapo_verl.main also checks the config)."
        elif v1 and filter_groups:
            message = (
                "verl's built-in filter_groups (ReplayBuffer): surplus groups discarded, max_num_gen_batches "
                "ignored. python -m dapo_verl.main runs dapo_verl's replenisher instead."
            )
        elif v1:
            message = "no dynamic sampling (algorithm.filter_groups.enable=false)."
        else:
            message = "no dynamic sampling: verl's legacy trainer has no filter_groups; use python -m dapo_verl.main."
        checks.append(Check("sampler", True, message, checked=False))
    from dapo_verl.rehearsal.recipe import component_settings, recipe_summary

    settings = component_settings(recipe_summary(config))
    algorithm = [f"{name}: {settings[name]}" for name in _ALGORITHM_COMPONENTS]
    checks.append(Check("algorithm", True, "; ".join(algorithm) + ".", checked=False))
    return checks


_ALGORITHM_COMPONENTS = (
    "decoupled-clip loss",
    "group advantage",
    "reward manager",
    "soft overlong punishment",
    "overlong filtering",
)
"""The components ``doctor``'s algorithm line names (the sampler and the prompts have lines of their own)."""
