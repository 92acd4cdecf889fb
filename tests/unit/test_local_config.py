"""Composing the local run config with Hydra: defaults, verl key names, and errors that name the key."""

from __future__ import annotations

import logging

import pytest

from dapo_verl.local.compose import compose_run
from dapo_verl.local.config import LocalRunConfig, defaults_tree, read_run_config


def test_default_experiment_composes_dapo_defaults_local_defaults_and_overrides():
    spec = compose_run()
    assert spec.dapo.loss.clip_ratio_high == 0.28  # from dapo_defaults
    assert spec.dapo.sampler.train_batch_size == 16  # overridden by local.yaml
    assert spec.dapo.max_response_length == 6
    assert spec.run == LocalRunConfig()  # every local key at its dataclass default
    assert spec.cfg["actor_rollout_ref"]["actor"]["optim"]["lr"] == 1e-3


def test_overrides_use_verl_key_names(tmp_path):
    spec = compose_run(["actor_rollout_ref.actor.clip_ratio_high=0.2", "actor_rollout_ref.rollout.n=4",
                        "local.model.hidden_size=32", "data.seed=7"], out_dir=tmp_path / "run")
    assert spec.dapo.loss.clip_ratio_high == 0.2
    assert spec.run.rollout.n == 4
    assert spec.run.local.model.hidden_size == 32
    assert spec.seed == 7
    assert spec.run.trainer.default_local_dir == str(tmp_path / "run")


def test_defaults_tree_round_trips_through_read_run_config():
    assert read_run_config(defaults_tree(LocalRunConfig)) == LocalRunConfig()


def test_unknown_key_fails_with_the_key_and_the_fix():
    with pytest.raises(ValueError, match=r"local\.model\.hidden.*--print-config"):
        compose_run(["local.model.hidden=32"])


@pytest.mark.parametrize(("override", "key"), [
    ("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.n"),
    ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr"),
    ("trainer.resume_mode=sometimes", "trainer.resume_mode"),
    ("local.device=tpu", "local.device"),
    ("local.model.num_attention_heads=3", "local.model.num_attention_heads"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=5", "actor_rollout_ref.actor.ppo_mini_batch_size"),
    ("algorithm.filter_groups.metric=score", "algorithm.filter_groups.metric"),
    ("actor_rollout_ref.actor.loss_agg_mode=token-sum", "actor_rollout_ref.actor.loss_agg_mode"),
    ("reward.reward_kwargs.overlong_tokens=8", "reward.reward_kwargs.overlong_tokens"),
])
def test_invalid_values_fail_at_start_naming_the_full_key(override, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        compose_run([override])


def test_clip_higher_inert_configuration_warns_once(caplog):
    with caplog.at_level(logging.WARNING, logger="dapo_verl.local.compose"):
        compose_run(["actor_rollout_ref.actor.ppo_mini_batch_size=16"])
    warnings = [r for r in caplog.records if "clip_ratio_high has no effect" in r.getMessage()]
    assert len(warnings) == 1


def test_several_gradient_steps_per_rollout_do_not_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="dapo_verl.local.compose"):
        compose_run()
    assert not [r for r in caplog.records if "clip_ratio_high" in r.getMessage()]


def test_cli_reports_a_bad_key_and_exits_2(capsys):
    from dapo_verl.cli import main

    assert main(["train", "local.device=tpu"]) == 2
    assert "local.device='tpu'" in capsys.readouterr().err


def test_cli_prints_the_composed_config(capsys):
    from dapo_verl.cli import main

    assert main(["train", "--print-config", "data.seed=3"]) == 0
    out = capsys.readouterr().out
    assert "seed: 3" in out
    assert "local:" in out
