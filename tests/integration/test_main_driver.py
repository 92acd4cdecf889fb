"""``python -m dapo_verl.main`` on the driver: the config is checked once, before Hydra starts the job.

The run itself (verl's ``run_ppo``, which starts Ray and needs the config's GPUs) is replaced by a recorder: what is
tested is what the driver does before it.
"""

from __future__ import annotations

import runpy
import sys

import pytest

from dapo_verl.config import DapoConfig

pytestmark = [
    pytest.mark.verl,
    pytest.mark.filterwarnings("ignore:.dapo_verl.main. found in sys.modules:RuntimeWarning"),  # runpy, as python -m
]

SIZES = [  # a config that passes every check, verl's validate_config included
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
]


@pytest.fixture
def driver(tmp_path, monkeypatch):
    """Run ``python -m dapo_verl.main ARGS`` in this process; return (reads of the DAPO section, configs run)."""
    import verl.trainer.main_ppo

    reads, runs = [], []
    from_verl = DapoConfig.from_verl.__func__

    def counted(cls, config):
        reads.append(config)
        return from_verl(cls, config)

    monkeypatch.setattr(DapoConfig, "from_verl", classmethod(counted))
    monkeypatch.setattr(verl.trainer.main_ppo, "run_ppo", lambda config, task_runner_class: runs.append(config))
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> tuple[list, list]:
        monkeypatch.setattr(sys, "argv", ["dapo_verl.main", *args, f"hydra.run.dir={tmp_path / 'hydra'}"])
        runpy.run_module("dapo_verl.main", run_name="__main__", alter_sys=False)
        return reads, runs

    return run


def test_a_cluster_start_reads_and_checks_the_dapo_section_once(driver):
    reads, runs = driver(*SIZES)
    assert len(runs) == 1  # the run started
    assert len(reads) == 1  # the pre-flight's read; run_dapo reused what it found


def test_a_config_the_preflight_did_not_see_is_checked_by_run_dapo(driver):
    from dapo_verl.main import _CHECKED, run_dapo
    from dapo_verl.preflight import ConfigRefused

    reads, runs = driver(*SIZES)
    config = runs[0]
    assert not _CHECKED  # the pre-flight's findings were used once
    run_dapo(config)  # a caller of its own: checked here
    assert len(reads) == 2 and len(runs) == 2
    config.actor_rollout_ref.rollout.n = 1
    with pytest.raises(ConfigRefused, match=r"actor_rollout_ref\.rollout\.n=1"):
        run_dapo(config)


@pytest.mark.parametrize(
    "overrides",
    [
        ["a=1"],
        ["a=1,2", "b=x,y,z"],
        ["a=1,2", "a=3"],  # the last override of a key wins, in the first one's place
        ["+c=choice(1,2)", "~d", "a=range(0,3)", "e=[1,2]", "f='p,q'"],
        ["b=glob(*)"],
    ],
)
def test_multirun_jobs_are_the_ones_hydras_basic_sweeper_runs(overrides):
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from dapo_verl.main import _multirun_jobs

    try:  # Hydra's own expansion, private: the reference, never called by the package
        expected = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(overrides), None)[0]
    except Exception as err:
        with pytest.raises(type(err)):
            _multirun_jobs(overrides)
    else:
        assert _multirun_jobs(overrides) == expected


def test_an_interval_sweep_is_refused_naming_the_override():
    from hydra.errors import HydraException

    from dapo_verl.main import _multirun_jobs

    with pytest.raises(HydraException, match=r"a=interval\(0,1\): Hydra's basic sweeper.* does not sweep an interval"):
        _multirun_jobs(["a=interval(0,1)"])
