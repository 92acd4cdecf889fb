"""The cluster recipes in dapo_verl/configs compose with verl 0.9.1's Hydra config and pass its validation.

verl instantiates most config sections as dataclasses; each recipe's actor, rollout and algorithm sections
are converted here exactly as verl's workers do. The reward section is the exception: in verl 0.9.1
``verl.workers.config.reward.RewardManagerConfig`` cannot be instantiated at all (its ``__post_init__``
calls a ``super().__post_init__`` that does not exist), so ``reward`` cannot become a ``RewardConfig``;
verl itself only ever reads it as a DictConfig. The sub-sections that do convert are converted, and what
the reward workers read (``reward.reward_manager.name``, ``reward.reward_kwargs``) is checked with
dapo_verl's own code: the reward-manager registry and ``dapo_verl.adapter.reward.reward_settings``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError
from verl.experimental.reward_loop.reward_manager.registry import get_reward_manager_cls
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import omega_conf_to_dataclass, validate_config
from verl.workers.config import FSDPActorConfig, RolloutConfig, SandboxFusionConfig

from dapo_verl.adapter.reward import DapoRewardManager, reward_settings
from dapo_verl.adapter.verl_config import DapoAlgoConfig
from dapo_verl.config import CONFIG_DIR
from dapo_verl.main import validate_dapo_config
from dapo_verl.report import derive_label

pytestmark = pytest.mark.verl

PAPER = "dapo_qwen2.5_32b"
SINGLE_NODE = "dapo_qwen2.5_math_1.5b"
ARMS = {0.2: "dapo_clip_ablation_eps_high_0.2", 0.28: "dapo_clip_ablation_eps_high_0.28"}
RECIPES = [PAPER, "dapo_wo_ds_qwen2.5_32b", "dapo_qwen2.5_7b", SINGLE_NODE, "dapo_clip_ablation", *ARMS.values()]
CLIP_HIGH = "actor_rollout_ref.actor.clip_ratio_high"

# Every number of the paper's run (arXiv 2503.14476 §4.1) and the published verl run
# (verl-recipe dapo/run_dapo_qwen2.5_32b.sh), at the key verl 0.9.1 reads.
PAPER_VALUES: dict[str, Any] = {
    "data.train_batch_size": 512,
    "actor_rollout_ref.rollout.n": 16,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "data.gen_batch_size": 1536,
    "data.max_prompt_length": 2048,
    "data.max_response_length": 20480,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
    "actor_rollout_ref.actor.optim.weight_decay": 0.1,
    "actor_rollout_ref.actor.optim.clip_grad": 1.0,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    CLIP_HIGH: 0.28,
    "actor_rollout_ref.actor.clip_ratio_c": 10.0,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "dapo",
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.0,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_ctrl.kl_coef": 0.0,
    "algorithm.adv_estimator": "dapo",
    "algorithm.overlong_filtering": False,
    "algorithm.filter_groups.enable": True,
    "algorithm.filter_groups.metric": "acc",
    "algorithm.filter_groups.max_num_gen_batches": 10,
    "algorithm.filter_groups.refill": "barrier",
    "reward.reward_manager.name": "dapo_verl",
    "reward.reward_kwargs.overlong_reward_penalty": True,
    "reward.reward_kwargs.overlong_tokens": 4096,
    "reward.reward_kwargs.overlong_penalty_factor": 1.0,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.8,
    "actor_rollout_ref.rollout.enable_chunked_prefill": True,
    "actor_rollout_ref.rollout.max_num_batched_tokens": 22528,
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.actor.strategy": "fsdp",
    "actor_rollout_ref.actor.fsdp_config.param_offload": True,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
    "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size": 8,
    "actor_rollout_ref.actor.use_dynamic_bsz": True,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 22528,
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": True,
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 22528,
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.model.enable_gradient_checkpointing": True,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 0.7,
    "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
    "actor_rollout_ref.rollout.val_kwargs.n": 32,
    "trainer.nnodes": 16,
    "trainer.n_gpus_per_node": 8,
    "trainer.val_before_train": True,
    "trainer.test_freq": 5,
    "trainer.save_freq": 5,
    "trainer.total_epochs": 1,
    "trainer.total_training_steps": 1166,
    # the paper's sampler: no history-based skipping, no revisits (dapo_verl's defaults turn both on)
    "algorithm.filter_groups.skip_uninformative": False,
    "algorithm.filter_groups.revisit_informative": False,
    # verl's v1 trainer (its default), with dapo_verl's batch replenisher as its sampler
    "trainer.use_v1": True,
    "trainer.v1.sampler.custom_sampler.path": "pkg://dapo_verl.adapter.v1_sampler",
    "trainer.v1.sampler.custom_sampler.name": "DapoReplayBuffer",
    "trainer.checkpoint_callback_class": "dapo_verl.adapter.v1_sampler.DapoCheckpointCallback",
}


def _root_configs() -> dict[str, DictConfig]:
    return {path.stem: OmegaConf.load(path) for path in sorted(CONFIG_DIR.glob("*.yaml"))}


def _is_primary_verl_config(config: DictConfig) -> bool:
    return OmegaConf.select(config, "hydra.searchpath") is not None


def _compose(name: str, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(name, overrides=list(overrides))


def _flat(config: DictConfig, *, resolve: bool) -> dict[str, Any]:
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = node

    walk(OmegaConf.to_container(config, resolve=resolve), "")
    return flat


@pytest.fixture
def paths(monkeypatch, tmp_path) -> dict[str, Path]:
    values = {
        "DAPO_MODEL_PATH": tmp_path / "model",
        "DAPO_DATA_DIR": tmp_path / "data",
        "DAPO_OUTPUT_DIR": tmp_path / "out",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, str(value))
    return values


def test_every_config_extending_ppo_trainer_is_a_primary_config_and_is_tested_here():
    primaries = set()
    for name, config in _root_configs().items():
        defaults = [str(entry) for entry in config.get("defaults", [])]
        if "ppo_trainer" in defaults:
            # Hydra finds ppo_trainer only through a searchpath, and only a primary config may set one.
            assert _is_primary_verl_config(config), f"{name}.yaml composes ppo_trainer but sets no hydra.searchpath"
            primaries.add(name)
    assert primaries == {"dapo_trainer", *RECIPES}, "add new recipes to RECIPES so they are validated here"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_and_passes_verl_and_dapo_validation(name, paths):
    config = _compose(name)
    resolved = OmegaConf.to_container(config, resolve=True)  # every interpolation, env vars included
    assert resolved["actor_rollout_ref"]["model"]["path"] == str(paths["DAPO_MODEL_PATH"])
    assert resolved["data"]["train_files"] == str(paths["DAPO_DATA_DIR"] / "train.parquet")
    assert resolved["data"]["val_files"] == str(paths["DAPO_DATA_DIR"] / "aime-2024.parquet")
    assert resolved["trainer"]["default_local_dir"].startswith(str(paths["DAPO_OUTPUT_DIR"] / "checkpoints"))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
        dapo = validate_dapo_config(config)
    assert not [str(w.message) for w in caught if issubclass(w.category, UserWarning)]  # no inert clip-higher
    assert not need_reference_policy(config) and not need_critic(config)

    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert isinstance(actor, FSDPActorConfig) and actor.policy_loss.loss_mode == "dapo"
    assert isinstance(omega_conf_to_dataclass(config.actor_rollout_ref.rollout), RolloutConfig)
    assert isinstance(omega_conf_to_dataclass(config.algorithm), DapoAlgoConfig)
    assert isinstance(omega_conf_to_dataclass(config.reward.sandbox_fusion), SandboxFusionConfig)
    # reward.reward_model is only built when enabled (its rollout.name is a required '???' otherwise).
    assert config.reward.reward_model.enable is False
    assert get_reward_manager_cls(config.reward.reward_manager.name) is DapoRewardManager
    overlong, budget = reward_settings(config)
    assert (overlong, budget) == (dapo.overlong, dapo.max_response_length)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_layout_fits_its_gpus(name, paths):
    """What verl checks only on the cluster: batch splits, sequence and tensor parallelism, token budgets."""
    c = _compose(name)
    actor, rollout = c.actor_rollout_ref.actor, c.actor_rollout_ref.rollout
    gpus = c.trainer.nnodes * c.trainer.n_gpus_per_node
    sp = actor.fsdp_config.ulysses_sequence_parallel_size
    assert gpus % sp == 0 and gpus % rollout.tensor_model_parallel_size == 0
    dp = gpus // sp
    assert c.data.train_batch_size % actor.ppo_mini_batch_size == 0
    assert c.data.train_batch_size * rollout.n % dp == 0 and actor.ppo_mini_batch_size * rollout.n % dp == 0
    sequence = c.data.max_prompt_length + c.data.max_response_length
    assert actor.use_dynamic_bsz and rollout.log_prob_use_dynamic_bsz
    assert actor.ppo_max_token_len_per_gpu * sp >= sequence  # verl: max_token_len >= longest sequence
    assert rollout.log_prob_max_token_len_per_gpu * sp >= sequence
    assert c.data.train_batch_size // actor.ppo_mini_batch_size * actor.ppo_epochs == 16  # paper §4.1
    if c.algorithm.filter_groups.enable:
        assert c.data.gen_batch_size == 3 * c.data.train_batch_size  # the published over-sampling


@pytest.mark.parametrize(("key", "expected"), sorted(PAPER_VALUES.items()))
def test_paper_recipe_value(paper_config, key, expected):
    assert OmegaConf.select(paper_config, key, throw_on_missing=True) == expected


@pytest.fixture(scope="module")
def paper_config():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DAPO_MODEL_PATH", "/models/Qwen2.5-32B")
        patch.setenv("DAPO_DATA_DIR", "/data/dapo")
        config = _compose(PAPER)
        OmegaConf.resolve(config)
    return config


def test_paper_recipe_values_reach_the_fields_verl_reads(paper_config):
    actor = omega_conf_to_dataclass(paper_config.actor_rollout_ref.actor)
    assert actor.engine.ulysses_sequence_parallel_size == 8  # the FSDP engine reads fsdp_config's value
    assert actor.optim.clip_grad == 1.0 and actor.optim.lr == 1e-6 and actor.optim.weight_decay == 0.1
    rollout = omega_conf_to_dataclass(paper_config.actor_rollout_ref.rollout)
    assert (rollout.val_kwargs.top_p, rollout.val_kwargs.n) == (0.7, 32)
    dapo = validate_dapo_config(paper_config)
    assert dapo.sampler.gen_batch_size == 1536 and dapo.sampler.max_num_gen_batches == 10
    assert dapo.overlong.overlong_tokens == 4096 and dapo.max_response_length == 20480


def test_without_dynamic_sampling_differs_from_the_paper_recipe_only_where_it_says(paths):
    full, wo_ds = (_flat(_compose(name), resolve=True) for name in (PAPER, "dapo_wo_ds_qwen2.5_32b"))
    changed = {key for key in full if full[key] != wo_ds[key]}
    identity = {key for key in changed if "dapo-wo-ds-clip-0.2-0.28" in str(wo_ds[key])}
    assert changed - identity == {
        "algorithm.filter_groups.enable",
        "data.gen_batch_size",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "trainer.total_training_steps",
    }
    assert "trainer.experiment_name" in identity


def test_clip_ablation_arms_differ_in_clip_ratio_high_only(paths):
    low, high = (_compose(ARMS[eps]) for eps in (0.2, 0.28))
    written_low, written_high = _flat(low, resolve=False), _flat(high, resolve=False)
    assert {k for k in written_low if written_low[k] != written_high[k]} == {CLIP_HIGH}
    resolved_low, resolved_high = _flat(low, resolve=True), _flat(high, resolve=True)
    changed = {k for k in resolved_low if resolved_low[k] != resolved_high[k]}
    assert (resolved_low[CLIP_HIGH], resolved_high[CLIP_HIGH]) == (0.2, 0.28)
    # The rest is run identity derived from eps_high, so the arms never share checkpoints or logs.
    assert "trainer.experiment_name" in changed and "trainer.default_local_dir" in changed
    for key in changed - {CLIP_HIGH}:
        assert "clip-ablation-eps-high-0.2" in str(resolved_low[key])
        assert "clip-ablation-eps-high-0.28" in str(resolved_high[key])


@pytest.mark.parametrize("eps_high", [0.2, 0.28])
def test_multirun_form_gives_the_arm_files(paths, eps_high):
    swept = _compose("dapo_clip_ablation", f"{CLIP_HIGH}={eps_high}")
    assert _flat(swept, resolve=True) == _flat(_compose(ARMS[eps_high]), resolve=True)


def test_clip_ablation_is_the_single_node_recipe_under_its_own_name(paths):
    ablation, single = _flat(_compose(ARMS[0.28]), resolve=True), _flat(_compose(SINGLE_NODE), resolve=True)
    changed = {key for key in single if single[key] != ablation[key]}
    assert changed and all("clip-ablation-eps-high-0.28" in str(ablation[key]) for key in changed)


def test_compare_groups_the_ablation_logs_into_one_arm_per_eps_high(paths):
    """The launchers point verl's FileLogger at $DAPO_OUTPUT_DIR/logs; each arm x seed writes its own log."""
    labels = {}
    for eps_high in ARMS:
        for seed in (0, 1):
            config = _compose("dapo_clip_ablation", f"{CLIP_HIGH}={eps_high}", f"data.seed={seed}")
            trainer = config.trainer
            log = paths["DAPO_OUTPUT_DIR"] / "logs" / trainer.project_name / f"{trainer.experiment_name}.jsonl"
            labels[eps_high, seed] = derive_label(log)
    assert len(set(labels.values())) == 2
    assert labels[0.2, 0] == labels[0.2, 1] == "clip-ablation-eps-high-0.2"
    assert labels[0.28, 0] == labels[0.28, 1] == "clip-ablation-eps-high-0.28"


@pytest.mark.parametrize(
    ("variable", "key"), [("DAPO_MODEL_PATH", "actor_rollout_ref.model.path"), ("DAPO_DATA_DIR", "data.train_files")]
)
def test_missing_path_variable_fails_naming_it(paths, monkeypatch, variable, key):
    monkeypatch.delenv(variable)
    config = _compose(PAPER)
    with pytest.raises(InterpolationResolutionError, match=f"Environment variable '{variable}' not found"):
        OmegaConf.select(config, key)


def test_verl_overlong_buffer_keys_are_read_next_to_ours(paths):
    agreeing = _compose(
        PAPER,
        "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
        "+reward.reward_kwargs.overlong_buffer_cfg.len=4096",
        "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward.reward_kwargs.max_resp_len=20480",
    )
    overlong, budget = reward_settings(agreeing)
    assert (overlong.overlong_tokens, overlong.overlong_penalty_factor, budget) == (4096, 1.0, 20480)
    contradicting = _compose(PAPER, "+reward.reward_kwargs.overlong_buffer_cfg.len=2048")
    with pytest.raises(
        ValueError,
        match=r"overlong_tokens=4096 contradicts reward\.reward_kwargs\.overlong_buffer_cfg"
        r"\.len=2048",
    ):
        reward_settings(contradicting)
    with pytest.raises(ValueError, match="overlong_tokens=4096 contradicts"):
        validate_dapo_config(contradicting)
