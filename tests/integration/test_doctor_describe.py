"""``dapo-verl doctor CONFIG_NAME``: which trainer and which sampler a config runs."""

from __future__ import annotations

import pytest

from dapo_verl.cli import main
from dapo_verl.doctor import describe_run
from dapo_verl.rehearsal.run import compose_recipe

pytestmark = pytest.mark.verl


def _describe(name, *overrides):
    config, entry = compose_recipe(name, list(overrides))
    return {check.name: check for check in describe_run(config, entry[2])}


@pytest.mark.parametrize("recipe", ["dapo_qwen2.5_32b", "dapo_clip_ablation_eps_high_0.2", "dapo_trainer"])
def test_every_recipe_runs_v1_with_the_replenisher(recipe):
    seen = _describe(recipe)
    assert seen["trainer"].ok and seen["trainer"].message.startswith("verl's v1 trainer (sync)")
    assert "DapoReplayBuffer" in seen["sampler"].message


def test_legacy_and_verl_own_trainers_are_named():
    legacy = _describe("dapo_trainer", "trainer.use_v1=false")
    assert "legacy RayPPOTrainer" in legacy["trainer"].message and "deprecates" in legacy["trainer"].message
    builtin = _describe("ppo_trainer", "actor_rollout_ref.rollout.name=vllm", "algorithm.filter_groups.enable=true")
    assert "built-in filter_groups" in builtin["sampler"].message
    wrong = _describe("dapo_trainer", "trainer.v1.sampler.custom_sampler.name=Other")
    assert not wrong["trainer"].ok and "DapoReplayBuffer" in wrong["trainer"].fix


def test_doctor_command_with_an_unknown_config_is_a_one_line_error(capsys):
    assert main(["doctor", "no_such_recipe"]) == 2
    assert "No config named 'no_such_recipe'" in capsys.readouterr().err
