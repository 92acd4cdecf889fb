"""What a rehearsal changes: only scale, hardware, engine and run keys; every algorithm setting stays the recipe's."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from dapo_verl.rehearsal.plan import Change, RehearsalShape, override_keys, rehearsal_changes
from dapo_verl.rehearsal.run import RehearsalError, compose_recipe

pytestmark = pytest.mark.verl

RECIPES = [
    "dapo_qwen2.5_32b",
    "dapo_wo_ds_qwen2.5_32b",
    "dapo_qwen2.5_7b",
    "dapo_qwen2.5_math_1.5b",
    "dapo_clip_ablation_eps_high_0.2",
    "dapo_clip_ablation_eps_high_0.28",
    "dapo_trainer",
]

# The algorithm: none of these may differ between a recipe and its rehearsal.
ALGORITHM_KEYS = [
    "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c",
    "actor_rollout_ref.actor.loss_agg_mode",
    "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.entropy_coeff",
    "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.optim.lr_warmup_steps",
    "actor_rollout_ref.actor.optim.weight_decay",
    "actor_rollout_ref.actor.optim.clip_grad",
    "actor_rollout_ref.actor.fsdp_config.param_offload",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "actor_rollout_ref.actor.use_dynamic_bsz",
    "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.temperature",
    "actor_rollout_ref.rollout.top_p",
    "actor_rollout_ref.rollout.val_kwargs.temperature",
    "actor_rollout_ref.rollout.val_kwargs.top_p",
    "algorithm.adv_estimator",
    "algorithm.norm_adv_by_std_in_grpo",
    "algorithm.overlong_filtering",
    "algorithm.use_kl_in_reward",
    "algorithm.filter_groups.enable",
    "algorithm.filter_groups.metric",
    "algorithm.filter_groups.max_num_gen_batches",
    "algorithm.filter_groups.refill",
    "algorithm.filter_groups.surplus",
    "algorithm.filter_groups.on_shortfall",
    "data.seed",
    "reward.reward_manager.name",
    "reward.reward_kwargs.overlong_reward_penalty",
    "reward.reward_kwargs.overlong_penalty_factor",
    "trainer.use_v1",
    "trainer.val_before_train",
    "trainer.test_freq",
    "trainer.total_epochs",
    "trainer.project_name",
    "trainer.experiment_name",
]


def _shape(tmp_path, **kw) -> RehearsalShape:
    values = dict(
        model_path=str(tmp_path / "model"),
        model_replaced=True,
        train_file=str(tmp_path / "t.parquet"),
        val_file=str(tmp_path / "v.parquet"),
        max_prompt_length=128,
        max_response_length=8,
        train_batch_size=4,
        gpus=1,
        steps=3,
        checkpoint_dir=str(tmp_path / "ckpt"),
        ray_temp_dir="/tmp/dvr-test",
    )
    values.update(kw)
    return RehearsalShape(**values)


def _apply(config, changes: list[Change]):
    """The config the rehearsal runs: the recipe with every change applied (added keys included)."""
    base = OmegaConf.create(OmegaConf.to_container(config))
    return OmegaConf.merge(base, OmegaConf.from_dotlist([c.override().lstrip("+") for c in changes]))


@pytest.mark.parametrize("name", RECIPES)
def test_rehearsal_changes_no_algorithm_key(name, tmp_path):
    config, entry = compose_recipe(name, [])
    changes = rehearsal_changes(config, _shape(tmp_path))
    changed = {c.key for c in changes}
    assert not changed & set(ALGORITHM_KEYS)
    assert entry[1:] == ["-m", "dapo_verl.main", f"--config-name={name}"]
    assert {c.group for c in changes} <= {"model", "scale", "hardware", "engine", "run"}
    rehearsed = _apply(config, changes)
    for key in ALGORITHM_KEYS:
        recipe = OmegaConf.select(config, key, throw_on_resolution_failure=False)
        assert OmegaConf.select(rehearsed, key, throw_on_resolution_failure=False) == recipe, key


def test_paper_recipe_is_shrunk_keeping_its_ratios(tmp_path):
    config, _ = compose_recipe("dapo_qwen2.5_32b", [])
    changes = {c.key: c for c in rehearsal_changes(config, _shape(tmp_path))}
    assert changes["data.train_batch_size"].rehearsal == 4
    assert changes["data.gen_batch_size"].rehearsal == 12  # the recipe's 3 x train_batch_size
    assert changes["actor_rollout_ref.actor.ppo_mini_batch_size"].rehearsal == 1  # several gradient steps, as 16
    # The overlong buffer keeps its share of the response budget: 4096 / 20480 = 20% of 8 tokens -> 2.
    assert changes["reward.reward_kwargs.overlong_tokens"].rehearsal == 2
    assert changes["actor_rollout_ref.rollout.name"].rehearsal == "dapo_cpu"
    assert changes["actor_rollout_ref.rollout.agent.num_workers"].rehearsal == 1  # one process to start, not 8
    assert changes["actor_rollout_ref.actor.strategy"].rehearsal == "fsdp2"
    assert changes["trainer.nnodes"].recipe == 16 and changes["trainer.nnodes"].rehearsal == 1
    assert changes["actor_rollout_ref.model.path"].recipe == "<unresolved: $DAPO_MODEL_PATH is not set>"
    assert changes["actor_rollout_ref.actor.fsdp_config.mixed_precision"].override() == (
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"
    )
    assert changes["ray_kwargs.ray_init.num_gpus"].override() == "+ray_kwargs.ray_init.num_gpus=1"


def test_user_overrides_are_the_recipe_and_their_sizes_are_kept(tmp_path):
    overrides = [
        "actor_rollout_ref.rollout.n=6",
        "algorithm.filter_groups.surplus=carry",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "data.gen_batch_size=8",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.agent.num_workers=2",
    ]
    config, _ = compose_recipe("dapo_trainer", overrides)
    changes = {c.key: c for c in rehearsal_changes(config, _shape(tmp_path, gpus=2), override_keys(overrides))}
    assert "actor_rollout_ref.rollout.n" not in changes and "algorithm.filter_groups.surplus" not in changes
    # Sizes the user chose for the rehearsal stay, and so does the agent-loop worker count (a test of request
    # padding needs 2); the engine is replaced whatever the user wrote.
    assert "actor_rollout_ref.actor.ppo_mini_batch_size" not in changes and "data.gen_batch_size" not in changes
    assert "actor_rollout_ref.rollout.agent.num_workers" not in changes
    assert changes["actor_rollout_ref.rollout.name"].rehearsal == "dapo_cpu"
    assert changes["trainer.n_gpus_per_node"].rehearsal == 2


def test_online_loggers_are_dropped_and_file_added(tmp_path):
    config, _ = compose_recipe("dapo_trainer", ["trainer.logger=[console,wandb]"])
    change = next(c for c in rehearsal_changes(config, _shape(tmp_path)) if c.key == "trainer.logger")
    assert change.rehearsal == ["console", "file"]
    assert "wandb need a network" in change.reason


def test_verl_own_trainer_config_runs_verl_main_ppo(tmp_path):
    config, entry = compose_recipe(
        "ppo_trainer", ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.actor.policy_loss.loss_mode=dapo"]
    )
    assert entry[1:] == ["-m", "verl.trainer.main_ppo"]
    keys = {c.key for c in rehearsal_changes(config, _shape(tmp_path))}
    assert "actor_rollout_ref.actor.policy_loss.loss_mode" not in keys


def test_unknown_config_names_the_choices():
    with pytest.raises(RehearsalError, match=r"No config named 'dapo_qwen3'.*dapo_qwen2\.5_32b.*ppo_trainer"):
        compose_recipe("dapo_qwen3", [])


@pytest.mark.parametrize("name", RECIPES)
def test_composing_without_importing_verl_gives_the_launchers_config(name):
    # The launcher resolves pkg://verl.trainer.config by importing verl; the rehearsal names the same folder.
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dapo_verl.config import CONFIG_DIR

    rehearsed, _ = compose_recipe(name, ["data.train_batch_size=8"])
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        launched = compose(config_name=name, overrides=["data.train_batch_size=8"])
    assert OmegaConf.to_container(rehearsed) == OmegaConf.to_container(launched)


def test_composing_a_recipe_does_not_import_verl():
    import subprocess
    import sys

    probe = (
        "import sys; from dapo_verl.rehearsal.run import compose_recipe; "
        "compose_recipe('dapo_qwen2.5_32b', []); print('verl' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("name", RECIPES)
def test_on_vllm_no_algorithm_key_or_sampling_parameter_changes(name, tmp_path):
    config, _ = compose_recipe(name, [])
    changes = rehearsal_changes(config, _shape(tmp_path, engine="vllm"))
    changed = {c.key for c in changes}
    sampling = {
        f"actor_rollout_ref.rollout.{k}"
        for k in (
            "temperature",
            "top_p",
            "top_k",
            "n",
            "val_kwargs.top_p",
            "val_kwargs.temperature",
            "gpu_memory_utilization",
            "load_format",
            "seed",
        )
    }
    assert not changed & (set(ALGORITHM_KEYS) | sampling)
    assert "actor_rollout_ref.rollout.name" not in changed  # every recipe names vllm: it stays
    rehearsed = _apply(config, changes)
    rollout = rehearsed.actor_rollout_ref.rollout
    assert rollout.dtype == "float32" and rollout.enforce_eager and not rollout.free_cache_engine
    assert rollout.enable_sleep_mode is False and rollout.enable_chunked_prefill is False
    # vLLM without chunked prefill needs a scheduler step that holds a whole sequence.
    assert rollout.max_model_len == rehearsed.data.max_prompt_length + rehearsed.data.max_response_length
    assert rollout.max_num_batched_tokens >= rollout.max_model_len and rollout.max_num_seqs >= 1


def test_long_tailed_lengths_on_vllm_report_the_models_own_log_probs(tmp_path):
    # The lengths mask EOS before each request's drawn length (min_tokens); vLLM's processed log-probs include that
    # mask, its raw ones are the model's, which the actor recomputes: the only change is logprobs_mode.
    plain, _ = compose_recipe("dapo_trainer", [])
    assert "actor_rollout_ref.rollout.logprobs_mode" not in {
        c.key for c in rehearsal_changes(plain, _shape(tmp_path, engine="vllm"))
    }
    config, _ = compose_recipe(
        "dapo_trainer", ["+actor_rollout_ref.rollout.engine_kwargs.dapo_cpu.response_lengths=long_tail"]
    )
    changes = {c.key: c for c in rehearsal_changes(config, _shape(tmp_path, engine="vllm"))}
    assert changes["actor_rollout_ref.rollout.logprobs_mode"].rehearsal == "raw_logprobs"
    assert changes["actor_rollout_ref.rollout.logprobs_mode"].recipe == "processed_logprobs"
    assert "actor_rollout_ref.rollout.logprobs_mode" not in {  # the stand-in reports the model's own anyway
        c.key for c in rehearsal_changes(config, _shape(tmp_path, engine="stand-in"))
    }


def test_the_paper_recipes_engine_budgets_shrink_by_the_sequence_lengths_factor(tmp_path):
    config, _ = compose_recipe("dapo_qwen2.5_32b", [])
    changes = {c.key: c for c in rehearsal_changes(config, _shape(tmp_path, engine="vllm"))}
    factor = 136 / 22528  # (128 + 8) / (2048 + 20480)
    assert changes["actor_rollout_ref.rollout.max_num_batched_tokens"].rehearsal == 136  # 22528 = prompt + response
    assert changes["actor_rollout_ref.rollout.max_num_seqs"].rehearsal == math.ceil(256 * factor) == 2
    assert changes["actor_rollout_ref.rollout.max_model_len"].recipe is None
    assert changes["actor_rollout_ref.rollout.enable_sleep_mode"].override() == (
        "+actor_rollout_ref.rollout.enable_sleep_mode=false"
    )  # not declared in verl's YAML
    assert "CPU generators" in changes["actor_rollout_ref.rollout.enable_chunked_prefill"].reason


def test_a_budget_that_relies_on_chunked_prefill_is_raised_to_a_whole_sequence(tmp_path):
    config, _ = compose_recipe(
        "dapo_trainer",
        ["actor_rollout_ref.rollout.max_num_batched_tokens=2048", "actor_rollout_ref.rollout.max_model_len=8192"],
    )
    changes = {c.key: c for c in rehearsal_changes(config, _shape(tmp_path, engine="vllm"))}
    model_len = changes["actor_rollout_ref.rollout.max_model_len"].rehearsal
    assert changes["actor_rollout_ref.rollout.max_num_batched_tokens"].rehearsal == model_len
    assert "whole prompt and response" in changes["actor_rollout_ref.rollout.max_num_batched_tokens"].reason


def test_a_cluster_overlong_buffer_given_on_the_command_line_is_scaled_to_fit(tmp_path):
    overrides = ["actor_rollout_ref.rollout.name=vllm", "+reward.reward_kwargs.overlong_tokens=4096"]
    config, _ = compose_recipe("ppo_trainer", overrides)
    changes = {c.key: c for c in rehearsal_changes(config, _shape(tmp_path), override_keys(overrides))}
    change = changes["reward.reward_kwargs.overlong_tokens"]
    assert change.recipe == 4096 and 1 <= change.rehearsal <= 8 and "exceeds the rehearsal's 8-token" in change.reason
    fits = ["actor_rollout_ref.rollout.name=vllm", "+reward.reward_kwargs.overlong_tokens=2"]
    config, _ = compose_recipe("ppo_trainer", fits)
    assert "reward.reward_kwargs.overlong_tokens" not in {
        c.key for c in rehearsal_changes(config, _shape(tmp_path), override_keys(fits))
    }  # a rehearsal size: kept


def test_cluster_lengths_given_on_the_command_line_are_scaled_when_the_model_cannot_hold_them(tmp_path):
    # A user's usual data.max_response_length=20480 cannot fit the stand-in's 4096 positions (vLLM refuses a
    # max_model_len above them): scaled like the recipe's, with the reason. A length the model holds is kept.
    cluster = ["data.max_response_length=20480", "+reward.reward_kwargs.overlong_tokens=4096"]
    config, _ = compose_recipe("ppo_trainer", cluster)
    shape = _shape(tmp_path, max_positions=4096, engine="vllm")
    changes = {c.key: c for c in rehearsal_changes(config, shape, override_keys(cluster))}
    response = changes["data.max_response_length"]
    assert (response.recipe, response.rehearsal) == (20480, 8)
    assert "exceed the model's 4096 positions" in response.reason
    assert changes["actor_rollout_ref.rollout.max_model_len"].rehearsal <= 4096
    assert changes["reward.reward_kwargs.overlong_tokens"].rehearsal == 2  # 4096 / 20480 of 8 tokens
    small = ["data.max_response_length=16"]
    config, _ = compose_recipe("ppo_trainer", small)
    assert "data.max_response_length" not in {
        c.key for c in rehearsal_changes(config, _shape(tmp_path, max_positions=4096), override_keys(small))
    }


def test_on_several_nodes_a_job_keeps_rays_start_up_and_the_recipes_paths_under_its_output_dir(tmp_path):
    config, _ = compose_recipe("dapo_qwen2.5_32b", [])
    changes = {c.key: c for c in rehearsal_changes(config, _shape(tmp_path, nodes=2))}
    assert (changes["trainer.nnodes"].recipe, changes["trainer.nnodes"].rehearsal) == (16, 2)
    assert not [key for key in changes if key.startswith("ray_kwargs.")]  # the job joins the running cluster
    assert "trainer.default_local_dir" not in changes  # ${oc.env:DAPO_OUTPUT_DIR,runs}/checkpoints/...: the job's own
    one_node = {c.key for c in rehearsal_changes(config, _shape(tmp_path))}
    assert {"trainer.default_local_dir", "ray_kwargs.ray_init._temp_dir", "ray_kwargs.ray_init.num_gpus"} <= one_node
    # verl's default folder (relative, not under DAPO_OUTPUT_DIR) would land wherever the job's driver runs.
    trainer, _ = compose_recipe("dapo_trainer", [])
    assert "trainer.default_local_dir" in {c.key for c in rehearsal_changes(trainer, _shape(tmp_path, nodes=2))}
