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
    spec = compose_run(
        [
            "actor_rollout_ref.actor.clip_ratio_high=0.2",
            "actor_rollout_ref.rollout.n=4",
            "local.model.hidden_size=32",
            "data.seed=7",
        ],
        out_dir=tmp_path / "run",
    )
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


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("actor_rollout_ref.rollout.n=1", "actor_rollout_ref.rollout.n"),
        ("actor_rollout_ref.actor.optim.lr=-1", "actor_rollout_ref.actor.optim.lr"),
        ("trainer.resume_mode=sometimes", "trainer.resume_mode"),
        ("local.device=tpu", "local.device"),
        ("local.model.num_attention_heads=3", "local.model.num_attention_heads"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size=5", "actor_rollout_ref.actor.ppo_mini_batch_size"),
        ("algorithm.filter_groups.metric=score", "algorithm.filter_groups.metric"),
        ("actor_rollout_ref.actor.loss_agg_mode=token-sum", "actor_rollout_ref.actor.loss_agg_mode"),
        ("reward.reward_kwargs.overlong_tokens=8", "reward.reward_kwargs.overlong_tokens"),
        ("algorithm.rollout_correction.rollout_is=sequence", "algorithm.rollout_correction.rollout_is"),
        ("algorithm.rollout_correction.rollout_is_threshold=0", "algorithm.rollout_correction.rollout_is_threshold"),
    ],
)
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


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.actor.clip_ratio_hihg=0.2",
        "+actor_rollout_ref.actor.clip_ratio_hihg=0.2",
        "++actor_rollout_ref.actor.clip_ratio_hihg=0.2",
    ],
)
def test_a_misspelled_key_is_refused_with_the_closest_valid_key(override):
    with pytest.raises(ValueError) as info:
        compose_run([override])
    message = str(info.value)
    assert "actor_rollout_ref.actor.clip_ratio_hihg" in message
    assert "did you mean actor_rollout_ref.actor.clip_ratio_high?" in message
    assert "use +" not in message.lower()  # Hydra's hint leads to a silently ignored key
    assert "\n" not in message


def test_an_added_key_the_local_backend_does_not_read_is_refused():
    with pytest.raises(ValueError, match=r"trainer\.nnodes.*not a key of the local backend"):
        compose_run(["+trainer.nnodes=2"])


def test_a_whole_section_and_a_forced_existing_key_may_be_overridden():
    spec = compose_run(
        [
            "local.model={hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 4}",
            "++data.seed=3",
        ]
    )
    assert spec.run.local.model.hidden_size == 32
    assert spec.seed == 3


def test_a_heldout_size_the_task_cannot_hold_fails_when_the_config_is_composed():
    with pytest.raises(ValueError, match=r"local\.task\.heldout_size=200 does not fit task summod"):
        compose_run(["local.task.name=summod"])


@pytest.mark.parametrize("key", ["local.cache_dir", "trainer.resume_from_path"])
@pytest.mark.parametrize("value", [1, 0.2, "''", "[]", "true"])
def test_path_keys_take_a_path_or_null_only(key, value):
    with pytest.raises(ValueError, match=rf"^{key.replace('.', '[.]')}=.* must be a path or null"):
        compose_run([f"{key}={value}"])
