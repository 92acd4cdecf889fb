"""The one pre-flight check: doctor, rehearse and python -m dapo_verl.main refuse what a run would refuse.

Each refused override below is one that ``dapo-verl train``, verl or the rehearsal refuses at start-up; the
check must name its key on one line and must never print ``[ok]`` for the config. The configs as shipped (every
recipe, ``dapo_trainer`` with no override, the README's ``loss_mode=dapo`` overrides) must pass.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from dapo_verl.adapter import doctor
from dapo_verl.adapter.preflight import DAPO_ENTRY, VERL_ENTRY, compose_and_check, verl_config_problems
from dapo_verl.cli import main
from dapo_verl.preflight import ConfigRefused
from dapo_verl.rehearsal.run import RehearsalOptions, compose_recipe, rehearse

pytestmark = pytest.mark.verl

RECIPES = ["dapo_qwen2.5_32b", "dapo_wo_ds_qwen2.5_32b", "dapo_qwen2.5_7b", "dapo_qwen2.5_math_1.5b",
           "dapo_clip_ablation_eps_high_0.2", "dapo_clip_ablation_eps_high_0.28", "dapo_trainer"]
README_OVERRIDES = [  # README.md, "Quickstart: loss_mode=dapo in your verl setup", on verl's own trainer
    "actor_rollout_ref.actor.policy_loss.loss_mode=dapo", "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "algorithm.adv_estimator=dapo", "reward.reward_manager.name=dapo_verl", "+reward.reward_kwargs.overlong_tokens=256",
    "+reward.reward_kwargs.overlong_penalty_factor=1.0",
    # the user's own setup: an engine, a group size and micro-batch sizes
    "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
]
MICRO_BATCHES = ["actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2"]  # docs/rehearse.md's dapo_trainer

# override -> the key the refusal must name (each refused at start-up by train, verl or the rehearsal)
REFUSED = {
    "actor_rollout_ref.actor.policy_loss.loss_mode=dapoo": "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.clip_ratio_hihg=0.3": "actor_rollout_ref.actor.clip_ratio_hihg",
    "+actor_rollout_ref.actor.clip_ratio_hihg=0.3": "actor_rollout_ref.actor.clip_ratio_hihg",
    "+actor_rollout_ref.actor.optim.lrr=1e-6": "actor_rollout_ref.actor.optim.lrr",
    "~data.train_batch_size": "data.train_batch_size",
    "actor_rollout_ref.actor.clip_ratio_low=3": "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.loss_agg_mode=token_mean": "actor_rollout_ref.actor.loss_agg_mode",
    "algorithm.adv_estimator=grpoo": "algorithm.adv_estimator",
    "reward.reward_manager.name=dapo-verl": "reward.reward_manager.name",
    "actor_rollout_ref.rollout.name=vlm": "actor_rollout_ref.rollout.name",
    "trainer.v1.trainer_mode=colocate": "trainer.v1.trainer_mode",
    "actor_rollout_ref.rollout.mode=sync": "actor_rollout_ref.rollout",
    "actor_rollout_ref.rollout.n=1": "actor_rollout_ref.rollout.n",
    "algorithm.filter_groups.metric=accuracy": "algorithm.filter_groups.metric",
    "algorithm.filter_groups.refill=adaptiv": "algorithm.filter_groups.refill",
    "reward.reward_kwargs.overlong_tokens=30000": "reward.reward_kwargs.overlong_tokens",
    "data.max_prompt_length=abc": "data.max_prompt_length",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null": "ppo_micro_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size=8": "ppo_micro_batch_size",
    "trainer.v1.sampler.custom_sampler.name=ReplayBuffer": "trainer.v1.sampler.custom_sampler",
    "data.train_batch_size=[1,": "data.train_batch_size=[1,",
    "actor_rollout_ref=5": "actor_rollout_ref",
    "+reward.reward_kwargs.overlong_tokenss=1024": "reward.reward_kwargs.overlong_tokenss",
    "+trainer.v1.trainerr_mode=sync": "trainer.v1.trainer_mode",  # found by the fuzzer: verl would ignore it
}


def _problems(name, *overrides):
    entry = VERL_ENTRY if name == "ppo_trainer" else DAPO_ENTRY
    try:
        compose_and_check(lambda: compose_recipe(name, list(overrides))[0], entry_module=entry,
                          unset_env_is_problem=False)
    except ConfigRefused as refused:
        return refused.problems
    return []


@pytest.mark.parametrize("name", RECIPES)
def test_every_config_as_shipped_passes(name):
    assert _problems(name) == []


def test_verl_setups_with_the_readme_overrides_and_own_micro_batches_pass():
    assert _problems("ppo_trainer", *README_OVERRIDES) == []
    assert _problems("dapo_trainer", *MICRO_BATCHES) == []


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_the_check_refuses_what_a_run_refuses_naming_the_key(override):
    problems = _problems("dapo_trainer", override)
    assert problems, f"{override} passed"
    assert any(REFUSED[override] in p.message for p in problems), [p.message for p in problems]
    assert all("\n" not in p.message for p in problems)


def test_every_problem_is_reported_at_once_the_refused_overrides_and_the_rest():
    problems = _problems("dapo_qwen2.5_32b", "actor_rollout_ref.actor.clip_ratio_hihg=0.3",
                         "actor_rollout_ref.actor.policy_loss.loss_mode=dapoo", "actor_rollout_ref.rollout.n=1")
    keys = [p.key for p in problems]
    assert keys[0] == "actor_rollout_ref.actor.clip_ratio_hihg" and "did you mean actor_rollout_ref.actor.clip_" \
        "ratio_high?" in problems[0].message
    assert {"actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.rollout.n"} <= set(keys)
    assert "Did you mean dapo?" in next(p.message for p in problems if p.key.endswith("loss_mode"))


def test_an_added_key_of_ones_own_or_a_free_form_section_is_accepted():
    assert _problems("dapo_trainer", "++trainer.v1.trainerr_mode=sync", "+trainer.my_own_setting=1",
                     "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_LOGGING_LEVEL=INFO",
                     "+actor_rollout_ref.model.override_config.attn_implementation=eager") == []


def test_unset_environment_variables_are_noted_and_refused_only_for_a_real_run():
    config, _ = compose_recipe("dapo_qwen2.5_32b", [])
    dry = verl_config_problems(config, entry_module=DAPO_ENTRY, unset_env_is_problem=False)
    assert dry.problems == [] and any("$DAPO_MODEL_PATH" in note for note in dry.unset)
    real = verl_config_problems(config, entry_module=DAPO_ENTRY, unset_env_is_problem=True)
    assert {p.key for p in real.problems} >= {"actor_rollout_ref.model.path", "data.train_files"}
    assert OmegaConf.select(config, "actor_rollout_ref.model.path", throw_on_resolution_failure=False) is None


def test_doctor_refuses_with_a_non_zero_exit_one_line_per_problem_and_no_ok_for_the_config(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "run_checks", lambda: [])  # the plugin checks start a fresh process; not the point
    code = main(["doctor", "dapo_qwen2.5_32b", "actor_rollout_ref.actor.policy_loss.loss_mode=dapoo",
                 "actor_rollout_ref.actor.clip_ratio_hihg=0.3"])
    out = capsys.readouterr().out
    assert code != 0
    failed = [line for line in out.splitlines() if line.startswith("[FAIL] config:")]
    assert len(failed) == 2 and "loss_mode='dapoo'" in out and "clip_ratio_hihg" in out
    assert "[ok] config" not in out and "[ok] algorithm" not in out
    assert "would be refused at start-up: 2 problem(s)" in out


def test_doctor_says_ok_only_for_what_it_checked(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "run_checks", lambda: [])
    assert main(["doctor", "dapo_trainer"]) == 0
    out = capsys.readouterr().out
    assert "[ok] config: dapo_trainer passes: dapo_verl settings, DAPO entry point" in out
    assert "verl's validate_config" in out
    assert "[info] trainer:" in out and "[ok] trainer" not in out  # described, not checked


def test_a_typo_given_to_rehearse_is_one_line_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "rehearsal"
    code = main(["rehearse", "dapo_trainer", "actor_rollout_ref.actor.clip_ratio_hihg=0.3", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and "did you mean actor_rollout_ref.actor.clip_ratio_high?" in err
    with pytest.raises(ConfigRefused, match="actor_rollout_ref.rollout.n=1"):
        rehearse(RehearsalOptions(config_name="dapo_trainer", overrides=("actor_rollout_ref.rollout.n=1",),
                                  out_dir=out))
    assert not out.exists()
