"""``python -m dapo_verl.main``: DAPO on verl (Hydra entry point; config ``configs/dapo_trainer.yaml``).

Like ``verl.trainer.main_ppo`` it validates the config and starts Ray with a TaskRunner:

* ``trainer.use_v1=true`` (the default, as in verl): verl's own v1 TaskRunner; the config names
  :class:`~dapo_verl.adapter.v1_sampler.DapoReplayBuffer` as its custom sampler and
  :class:`~dapo_verl.adapter.v1_sampler.DapoCheckpointCallback` as its checkpoint callback.
* ``trainer.use_v1=false``: verl's legacy TaskRunner, building :class:`~dapo_verl.adapter.trainer.DapoRayTrainer`
  (verl deprecates the legacy trainer).

``--help`` and ``--cfg job`` show the resolved configuration without starting anything. Before Hydra starts the
job, :func:`preflight` checks the command line's config (every job of a multirun) with the one pre-flight
check (:mod:`dapo_verl.preflight` and :mod:`dapo_verl.adapter.preflight`); a config a run would refuse gets one
line per problem on stderr and exit status 2, under ``--cfg job`` too (the recipes' ``--dry-run``). The config is
checked once on the driver: :func:`run_dapo` checks only a config the pre-flight did not (another config folder,
or a caller of its own).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from dapo_verl.adapter.preflight import DAPO_ENTRY, Findings, check_verl_config, compose_and_check
from dapo_verl.adapter.preflight_dapo import clip_higher_warning, dapo_entry_problems
from dapo_verl.config import CONFIG_DIR, DapoConfig
from dapo_verl.preflight import ConfigRefused, compose_config_dir, one_line, raise_if_any

__all__ = ["main", "preflight", "run_dapo", "validate_dapo_config"]

logger = logging.getLogger(__name__)


def validate_dapo_config(config: DictConfig) -> DapoConfig:
    """Check the DAPO-specific parts of a composed config; return the parsed :class:`DapoConfig`.

    The part of :func:`~dapo_verl.adapter.preflight.check_verl_config` that reads no verl module; warns when
    clip-higher cannot act.

    Raises:
        ValueError: naming the offending key and the fix (:class:`~dapo_verl.preflight.ConfigRefused`, one
            problem per line).
    """
    dapo = DapoConfig.from_verl(config)
    raise_if_any(dapo_entry_problems(config, dapo))
    clip_higher_warning(config, dapo)
    return dapo


@contextlib.contextmanager
def _trainer_class(namespace: dict[str, Any], trainer_cls: type) -> Iterator[None]:
    """Make verl's ``TaskRunner.run`` build ``trainer_cls`` instead of ``RayPPOTrainer``.

    ``TaskRunner.run`` (verl/trainer/main_ppo_v0.py) constructs the trainer through the global name
    ``RayPPOTrainer``. ``namespace`` must be the globals of the ``run`` function that executes: Ray ships
    the TaskRunner class to its process by value (cloudpickle cannot find ``@ray.remote``'s original class by
    name), so ``run`` reads a copy of the module's globals, not ``verl.trainer.main_ppo_v0`` itself. Swapping
    the name there is the smallest override that avoids copying ``run``.
    """
    original = namespace["RayPPOTrainer"]
    namespace["RayPPOTrainer"] = trainer_cls
    try:
        yield
    finally:
        namespace["RayPPOTrainer"] = original


def _task_runner_class() -> Any:
    import ray
    from verl.trainer.main_ppo_v0 import TaskRunner

    from dapo_verl.adapter.trainer import DapoRayTrainer

    class DapoTaskRunner(TaskRunner.__ray_actor_class__):
        """verl's TaskRunner, building :class:`~dapo_verl.adapter.trainer.DapoRayTrainer`."""

        def run(self, config):
            with _trainer_class(super().run.__func__.__globals__, DapoRayTrainer):
                return super().run(config)

    return ray.remote(num_cpus=1)(DapoTaskRunner)


_CHECKED: dict[str, Findings] = {}
"""What :func:`preflight` found for each config it passed in this process, by its unresolved YAML: Hydra hands
:func:`main` that same config, which :func:`run_dapo` then does not check again."""


def run_dapo(config: DictConfig) -> None:
    """Validate ``config`` (unless :func:`preflight` passed it in this process) and train with Ray workers (needs
    the GPUs the config asks for)."""
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    import dapo_verl.adapter.register  # noqa: F401  (the driver process too; the workers get the entry point)

    checked = _CHECKED.pop(OmegaConf.to_yaml(config), None)
    auto_set_device(config)
    findings = checked or check_verl_config(config, entry_module=DAPO_ENTRY)  # verl's validate_config among them
    assert findings.dapo is not None  # read, or the check would have raised
    clip_higher_warning(config, findings.dapo)
    if config.trainer.use_v1:
        from verl.trainer.main_ppo import TaskRunnerV1

        run_ppo(config, task_runner_class=TaskRunnerV1)
    else:
        logger.warning(
            "trainer.use_v1=false: verl's legacy trainer, which verl deprecates; dapo_verl's batch "
            "replenisher drives it as it drives the v1 trainer's sampler."
        )
        run_ppo(config, task_runner_class=_task_runner_class())


_HYDRA_INFO_FLAGS = {
    "-h",
    "--help",
    "--hydra-help",
    "--version",
    "-i",
    "--info",
    "-sc",
    "--shell-completion",
    "--experimental-rerun",
    "-cp",
    "--config-path",
    "-cd",
    "--config-dir",
}
"""Hydra options after which the pre-flight check is left to Hydra and :func:`run_dapo` (help, another folder)."""
_HYDRA_VALUED = {"-cn", "--config-name", "-c", "--cfg", "-p", "--package"}


def preflight(argv: Sequence[str]) -> list[str]:
    """Check the command line's configs as :func:`run_dapo` would, before Hydra starts anything.

    Every job of a multirun (``-m``) is checked. With ``--cfg`` (a dry run, as the recipes' ``--dry-run``
    prints) an unset environment variable is only a note, since the config is printed unresolved.

    Returns:
        One line per problem (empty when the configs pass).
    """
    if _HYDRA_INFO_FLAGS & {arg.split("=", 1)[0] for arg in argv}:
        return []
    config_name, overrides, flags = "dapo_trainer", [], set()
    args = iter(argv)
    for arg in args:
        name, has_value, value = arg.partition("=")
        if name in _HYDRA_VALUED:
            value = value if has_value else next(args, "")
            config_name = value if name in ("-cn", "--config-name") else config_name
            flags.add(name)
        elif arg.startswith("-"):
            flags.add(arg)
        else:
            overrides.append(arg)
    if not (CONFIG_DIR / f"{config_name}.yaml").is_file():
        return []  # Hydra names the missing config itself
    dry_run = bool({"-c", "--cfg"} & flags) and "--resolve" not in flags
    lines = []
    jobs = _multirun_jobs(overrides) if {"-m", "--multirun"} & flags else [overrides]
    for number, job in enumerate(jobs):
        where = f"job {number} ({' '.join(job)}): " if len(jobs) > 1 else ""
        try:
            config, findings = compose_and_check(
                lambda j=job: compose_config_dir(str(CONFIG_DIR), config_name, j),
                entry_module=DAPO_ENTRY,
                unset_env_is_problem=not dry_run,
            )
        except ConfigRefused as refused:
            lines += [where + line for line in refused.lines()]
        else:
            if not dry_run:
                _CHECKED[OmegaConf.to_yaml(config)] = findings
    return lines


def _multirun_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """The jobs Hydra's basic sweeper runs for a multirun of ``overrides``: the product of each key's values, in
    order, the last override of a key replacing earlier ones.

    Hydra offers no public call that lists a sweep's jobs before it runs them (its sweeper plugins expand them
    inside ``sweep()``, which also launches them), so the overrides are read with Hydra's public grammar
    (``OverridesParser``, ``Override.sweep_string_iterator``) and combined by the basic sweeper's documented rule
    (``tests/integration/test_main_driver.py`` compares the two).

    Raises:
        HydraException: for a sweep the basic sweeper does not run (an interval), as Hydra would.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        key = override.get_key_element()
        if not override.is_sweep_override():
            choices[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            choices[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            raise HydraException(
                f"{override.input_line}: Hydra's basic sweeper, which runs dapo_verl's multiruns, does not sweep "
                f"an interval. List the values (key=a,b,c) or use range(start,stop,step)."
            )
    return [list(job) for job in itertools.product(*choices.values())]


@hydra.main(config_path=str(CONFIG_DIR), config_name="dapo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """Hydra entry point: one line per problem and exit status 2 for a config a run would refuse."""
    try:
        run_dapo(config)
    except ConfigRefused as refused:
        _exit_with(refused.lines())


def _exit_with(lines: Sequence[str]) -> None:
    for line in lines:
        print(f"python -m dapo_verl.main: {line}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    try:
        problems = preflight(sys.argv[1:])
    except ConfigRefused as refused:  # a multirun sweep Hydra cannot parse
        problems = refused.lines()
    except HydraException as err:
        problems = [one_line(err)]
    if problems:
        _exit_with(problems)
    main()
