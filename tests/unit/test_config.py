"""Config dataclasses: defaults from the paper, validation messages with full keys, verl round trip."""

from __future__ import annotations

import dataclasses

import pytest

from dapo_verl.config import (
    DapoConfig,
    LossConfig,
    OverlongConfig,
    SamplerConfig,
    clip_higher_inert_reason,
    iter_verl_fields,
)
from dapo_verl.core import LossAggregation


def test_defaults_follow_the_paper():
    config = DapoConfig()
    assert (config.loss.clip_ratio_low, config.loss.clip_ratio_high) == (0.2, 0.28)
    assert config.loss.aggregation is LossAggregation.TOKEN_MEAN_GLOBAL
    assert (config.overlong.overlong_tokens, config.overlong.overlong_penalty_factor) == (4096, 1.0)
    assert config.max_response_length == 20480
    assert config.sampler.metric == "acc" and config.sampler.enable
    assert config.sampler.surplus == "discard"  # carrying trains off-policy: opt-in
    assert config.sampler.skip_uninformative and config.sampler.revisit_informative  # cost only; measured, README


def test_configs_are_frozen_and_keyword_only():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DapoConfig().max_response_length = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        LossConfig(0.2)  # type: ignore[misc]


def test_every_field_has_a_unique_verl_key():
    keys = [key for key, _ in iter_verl_fields()]
    assert len(keys) == len(set(keys))
    assert "actor_rollout_ref.actor.clip_ratio_high" in keys
    assert "algorithm.filter_groups.max_num_gen_batches" in keys
    assert "reward.reward_kwargs.overlong_tokens" in keys


def test_verl_round_trip():
    config = DapoConfig(
        loss=LossConfig(clip_ratio_high=0.3),
        sampler=SamplerConfig(train_batch_size=32, gen_batch_size=96, surplus="carry", refill="barrier"),
        max_response_length=1024,
        overlong=OverlongConfig(overlong_tokens=256, overlong_schedule="quadratic"),
    )
    assert DapoConfig.from_verl(config.to_verl()) == config


def test_missing_and_null_keys_take_defaults():
    assert DapoConfig.from_verl({}) == DapoConfig()
    assert DapoConfig.from_verl({"data": {"seed": None, "gen_batch_size": None}}) == DapoConfig()


def test_verl_overlong_buffer_keys_are_aliases():
    cfg = {
        "data": {"max_response_length": 100},
        "reward": {
            "reward_kwargs": {
                "overlong_buffer_cfg": {"enable": True, "len": 20, "penalty_factor": 0.5},
                "max_resp_len": 100,
            }
        },
    }
    overlong = DapoConfig.from_verl(cfg).overlong
    assert (overlong.overlong_reward_penalty, overlong.overlong_tokens, overlong.overlong_penalty_factor) == (
        True,
        20,
        0.5,
    )


def test_contradicting_aliases_are_refused():
    cfg = {
        "data": {"max_response_length": 100},
        "reward": {"reward_kwargs": {"overlong_tokens": 30, "overlong_buffer_cfg": {"len": 20}}},
    }
    with pytest.raises(ValueError, match="overlong_tokens=30 contradicts .*overlong_buffer_cfg.len=20"):
        DapoConfig.from_verl(cfg)
    cfg = {
        "data": {"max_response_length": 100},
        "reward": {"reward_kwargs": {"overlong_tokens": 30, "overlong_buffer_cfg": {"len": 30}, "max_resp_len": 50}},
    }
    with pytest.raises(ValueError, match="max_resp_len=50 differs from data.max_response_length=100"):
        DapoConfig.from_verl(cfg)


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (
            {"actor_rollout_ref": {"actor": {"clip_ratio_low": -0.1}}},
            r"actor_rollout_ref.actor.clip_ratio_low=-0.1 must lie in \[0.0, 1.0\]",
        ),
        ({"actor_rollout_ref": {"actor": {"clip_ratio_c": 1.0}}}, "clip_ratio_c=1.0 must be > 1.0"),
        ({"actor_rollout_ref": {"actor": {"loss_agg_mode": "mean"}}}, "loss_agg_mode='mean' is not one of"),
        (
            {"reward": {"reward_kwargs": {"overlong_schedule": "quad"}}},
            r"overlong_schedule='quad' is not one of \['linear', 'quadratic'\].*register_overlong_schedule",
        ),
        ({"reward": {"reward_kwargs": {"overlong_tokens": -5}}}, "overlong_tokens=-5 must be > 0"),
        (
            {"data": {"max_response_length": 1000}},
            "overlong_tokens=4096 exceeds data.max_response_length=1000.*Set overlong_tokens <= 1000",
        ),
        (
            {"algorithm": {"filter_groups": {"max_num_gen_batches": 0}}},
            "max_num_gen_batches=0 must be >= 1.*Unlimited rounds can loop forever",
        ),
        ({"algorithm": {"filter_groups": {"surplus": "keep"}}}, r"surplus='keep' is not one of \['discard', 'carry'\]"),
        ({"algorithm": {"filter_groups": {"on_shortfall": "ignore"}}}, "on_shortfall='ignore' is not one of"),
        ({"algorithm": {"filter_groups": {"single_round_probability": 1.0}}}, "would ask for unboundedly many"),
        ({"algorithm": {"filter_groups": {"max_skip_probability": 1.0}}}, "would skip prompts for good"),
        ({"algorithm": {"filter_groups": {"metric": ""}}}, "metric='' must name a per-response value"),
        ({"algorithm": {"filter_groups": {"enable": "yes"}}}, "enable='yes' must be a boolean"),
        ({"algorithm": {"adv_epsilon": -1}}, "algorithm.adv_epsilon=-1 must be >= 0.0"),
        (
            {"algorithm": {"group_token_mean": True}},
            "loss_agg_mode='token-mean' does not match algorithm.group_token_mean",
        ),
        ({"data": {"train_batch_size": 2.5}}, "data.train_batch_size=2.5 must be a finite integer"),
    ],
)
def test_misconfiguration_names_the_key_and_the_fix(cfg, match):
    with pytest.raises(ValueError, match=match):
        DapoConfig.from_verl(cfg)


def test_local_only_aggregation_modes():
    with pytest.raises(ValueError, match="runs in verl but not on the local backend"):
        _ = LossConfig(loss_agg_mode="token-sum").aggregation


def test_clip_higher_inert_reason():
    assert clip_higher_inert_reason(train_batch_size=8, ppo_mini_batch_size=8, ppo_epochs=1) is not None
    assert clip_higher_inert_reason(train_batch_size=8, ppo_mini_batch_size=4, ppo_epochs=1) is None
    assert clip_higher_inert_reason(train_batch_size=8, ppo_mini_batch_size=8, ppo_epochs=2) is None


def _bool_keys(cls):
    return [key for key, leaf in iter_verl_fields(cls) if isinstance(leaf.default, bool)]


@pytest.mark.parametrize("key", _bool_keys(DapoConfig))
@pytest.mark.parametrize("value", ["", [], "false", "true", 0, 1, "yes"])
def test_every_boolean_key_refuses_anything_but_a_boolean(key, value):
    tree = DapoConfig().to_verl()
    node = tree
    *parents, leaf = key.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    expected = rf"^{key.replace('.', '[.]')}=.* must be a boolean\. Use true or false, unquoted"
    with pytest.raises(ValueError, match=expected):
        DapoConfig.from_verl(tree)


def test_every_boolean_key_of_the_local_backend_refuses_a_string():
    from dapo_verl.local.config import LocalRunConfig, defaults_tree, read_run_config

    for key in _bool_keys(LocalRunConfig):
        tree = defaults_tree(LocalRunConfig)
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = "false"
        with pytest.raises(ValueError, match=rf"^{key.replace('.', '[.]')}='false' must be a boolean"):
            read_run_config(tree)
