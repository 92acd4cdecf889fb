"""Knobs of the local backend that DAPO's own config does not hold, declared once as frozen dataclasses.

Two kinds of keys live here, each with its dotted key in the composed Hydra config
(``metadata["verl_key"]``):

* verl's own training keys, under verl's names and meaning (``actor_rollout_ref.rollout.n``,
  ``actor_rollout_ref.actor.ppo_mini_batch_size``, ``actor_rollout_ref.actor.optim.lr``,
  ``trainer.total_training_steps``, ...), with defaults sized for the embedded CPU experiment;
* the ``local.*`` section for what verl has no name for: the tiny model, the synthetic task, device and
  threads.

The DAPO keys themselves (clip ratios, loss aggregation, filter groups, overlong shaping, batch sizes,
``data.seed``) come from :class:`dapo_verl.config.DapoConfig`. The defaults of this module reach Hydra
through ``configs/local_defaults.yaml``, generated from these dataclasses by ``dapo-verl config --write`` as
``dapo_defaults.yaml`` is from :mod:`dapo_verl.config` (``--check`` fails when it is stale), so each number has one
home. Imports only the standard library and
``dapo_verl.config``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dapo_verl.config import (
    config_error,
    defaults_tree,
    key_of,
    read_verl_section,
    require_bool,
    require_choice,
    require_number,
    verl_key,
)

__all__ = [
    "ActorConfig",
    "Device",
    "LocalConfig",
    "LocalRunConfig",
    "ModelConfig",
    "ResumeMode",
    "RolloutConfig",
    "TaskConfig",
    "TrainerConfig",
    "WarmStartConfig",
    "defaults_tree",
    "read_run_config",
]


def _require_path_or_none(config: object, name: str, fix: str) -> None:
    """Raise unless field ``name`` is None or a non-empty string (a path)."""
    value = getattr(config, name)
    if value is not None and (not isinstance(value, str) or not value):
        config_error(key_of(config, name), value, "must be a path or null", fix)


class Device(StrEnum):
    """Where the local backend runs: ``auto`` (the GPU if one is visible, else CPU), ``cpu`` or ``cuda``."""

    AUTO = "auto"
    CPU = "cpu"
    CUDA = "cuda"


class ResumeMode(StrEnum):
    """verl's ``trainer.resume_mode``: ``auto`` (latest checkpoint in the run directory, if any),
    ``disable`` (always start fresh), ``resume_path`` (the checkpoint at ``trainer.resume_from_path``)."""

    AUTO = "auto"
    DISABLE = "disable"
    RESUME_PATH = "resume_path"


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """Sampling of the training responses."""

    n: int = field(default=8, metadata=verl_key("actor_rollout_ref.rollout.n", verl_native=True))
    """G, responses sampled per prompt. Range >= 2 (a group needs a baseline); paper §4.1 uses 16."""

    temperature: float = field(
        default=1.0, metadata=verl_key("actor_rollout_ref.rollout.temperature", verl_native=True)
    )
    """Sampling temperature of training rollouts; log-probs are computed at the same temperature. Range > 0."""

    val_n: int = field(default=1, metadata=verl_key("actor_rollout_ref.rollout.val_kwargs.n", verl_native=True))
    """Held-out responses sampled per prompt at the rollout temperature, besides the greedy one: above 1, each
    evaluation also logs pass@k for k = 2, 4, ..., val_n (verl's best@k names) and the sampled accuracy; 1 (verl's
    default) evaluates greedily only. Set it to n for pass@k up to the group size.
    """

    chunk_tokens: int = field(default=8, metadata=verl_key("local.rollout.chunk_tokens", verl_native=False))
    """With algorithm.filter_groups.streaming=true: tokens every running response advances per decoding pass (groups
    finish, and can be aborted, between passes). Range >= 1.
    """

    stale_prefix: str = field(default="train", metadata=verl_key("local.rollout.stale_prefix", verl_native=False))
    """With streaming and surplus=carry: what the loss does with a continued response's tokens sampled by an earlier
    policy. train: trained like the rest, their old log-probs recomputed by the current policy, as verl's partial
    rollouts are without rollout correction (a token at most one step stale is treated as on-policy). mask: left out
    of the loss (they still condition the rest); in the declared local comparison (docs/local.md) mask lost 0.25 of
    held-out accuracy AUC against rounds and train held it. Choices: train, mask.
    """

    def __post_init__(self) -> None:
        require_number(self, "n", low=2, integer=True, fix="Group-normalised advantages need G >= 2; use 8.")
        require_number(self, "temperature", low=0.0, low_open=True, fix="The paper samples at 1.0.")
        require_number(
            self,
            "val_n",
            low=1,
            integer=True,
            fix="Use 1 for greedy evaluation only, or e.g. 8 (the group size) for pass@1..8.",
        )
        require_number(self, "chunk_tokens", low=1, integer=True, fix="8 lets groups finish every 8 tokens.")
        require_choice(
            self,
            "stale_prefix",
            ["train", "mask"],
            fix="train keeps older-policy tokens in the loss; mask leaves them out.",
        )


@dataclass(frozen=True, kw_only=True)
class RolloutCorrectionConfig:
    """Truncated importance sampling against the policy that sampled a response (verl's rollout correction)."""

    rollout_is: str | None = field(
        default=None, metadata=verl_key("algorithm.rollout_correction.rollout_is", verl_native=True)
    )
    """null (off, verl's default) or token: each response token's loss term is multiplied by min(pi_old /
    pi_rollout, rollout_is_threshold), pi_old the policy before this update (the recomputed old log-probs) and
    pi_rollout the one that sampled the token (its log-probs kept at generation, one more forward pass a round). It
    acts on groups trained a step after they were sampled (surplus=carry); a fresh group's weights are 1. Rounds
    only: streaming refuses it on the local backend. verl's sequence level is not implemented here.
    """

    rollout_is_threshold: float = field(
        default=2.0, metadata=verl_key("algorithm.rollout_correction.rollout_is_threshold", verl_native=True)
    )
    """Upper bound of a token's weight (truncated importance sampling). Range > 0; verl's default 2.0."""

    def __post_init__(self) -> None:
        if self.rollout_is is not None and self.rollout_is != "token":
            config_error(
                key_of(self, "rollout_is"),
                self.rollout_is,
                "is not available on the local backend",
                "Use token (per-token weights) or null (off).",
            )
        require_number(self, "rollout_is_threshold", low=0.0, low_open=True, fix="verl's default is 2.0.")


@dataclass(frozen=True, kw_only=True)
class ActorConfig:
    """The policy update: batching, optimiser and regularisation."""

    ppo_mini_batch_size: int = field(
        default=4, metadata=verl_key("actor_rollout_ref.actor.ppo_mini_batch_size", verl_native=True)
    )
    """Prompt groups per gradient step; train_batch_size / ppo_mini_batch_size steps per rollout and epoch. Range >= 1.
    """

    ppo_micro_batch_size_per_gpu: int | None = field(
        default=None, metadata=verl_key("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", verl_native=True)
    )
    """Responses per forward/backward pass (gradient accumulation); null means the whole mini-batch. The loss is
    normalised by the mini-batch's token count, so this never changes the result.
    """

    ppo_epochs: int = field(default=1, metadata=verl_key("actor_rollout_ref.actor.ppo_epochs", verl_native=True))
    """Passes over each rollout batch. Range >= 1."""

    lr: float = field(default=1e-3, metadata=verl_key("actor_rollout_ref.actor.optim.lr", verl_native=True))
    """AdamW learning rate (constant). 1e-3 suits the tiny default model; 3e-3 collapses its entropy."""

    weight_decay: float = field(
        default=0.0, metadata=verl_key("actor_rollout_ref.actor.optim.weight_decay", verl_native=True)
    )
    """AdamW weight decay. Range >= 0; 0 for the tiny model (verl defaults to 0.01)."""

    grad_clip: float = field(default=1.0, metadata=verl_key("actor_rollout_ref.actor.grad_clip", verl_native=True))
    """Gradient-norm clipping threshold per gradient step. Range > 0; verl's default 1.0."""

    entropy_coeff: float = field(
        default=0.0, metadata=verl_key("actor_rollout_ref.actor.entropy_coeff", verl_native=True)
    )
    """Weight of the entropy bonus subtracted from the policy loss. Range >= 0; DAPO uses 0."""

    def __post_init__(self) -> None:
        require_number(self, "ppo_mini_batch_size", low=1, integer=True, fix="Use e.g. train_batch_size / 4.")
        if self.ppo_micro_batch_size_per_gpu is not None:
            require_number(
                self,
                "ppo_micro_batch_size_per_gpu",
                low=1,
                integer=True,
                fix="Use a positive number of responses, or null for the whole mini-batch.",
            )
        require_number(self, "ppo_epochs", low=1, integer=True, fix="Use 1 or more.")
        require_number(self, "lr", low=0.0, low_open=True, fix="1e-3 works for the tiny default model.")
        require_number(self, "weight_decay", low=0.0, fix="Use 0.0 or a small value such as 0.01.")
        require_number(self, "grad_clip", low=0.0, low_open=True, fix="verl's default is 1.0.")
        require_number(self, "entropy_coeff", low=0.0, fix="DAPO uses 0.")


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """Run length, evaluation, checkpoints and output."""

    total_training_steps: int = field(default=200, metadata=verl_key("trainer.total_training_steps", verl_native=True))
    """Training steps (one filled batch each, whatever the number of generation rounds). Range >= 1."""

    test_freq: int = field(default=25, metadata=verl_key("trainer.test_freq", verl_native=True))
    """Evaluate every this many steps and after the last one; -1 never (as in verl)."""

    val_before_train: bool = field(default=True, metadata=verl_key("trainer.val_before_train", verl_native=True))
    """Evaluate the untrained model at step 0."""

    save_freq: int = field(default=100, metadata=verl_key("trainer.save_freq", verl_native=True))
    """Checkpoint every this many steps and after the last one; -1 never (as in verl)."""

    default_local_dir: str = field(
        default="runs/local", metadata=verl_key("trainer.default_local_dir", verl_native=True)
    )
    """Run directory: metrics, plots, TensorBoard events, checkpoints and the final model (--out sets it)."""

    resume_mode: str = field(default="auto", metadata=verl_key("trainer.resume_mode", verl_native=True))
    """auto: continue from the latest checkpoint in the run directory; disable: start fresh; resume_path: from
    trainer.resume_from_path.
    """

    resume_from_path: str | None = field(default=None, metadata=verl_key("trainer.resume_from_path", verl_native=True))
    """Checkpoint directory (global_step_N) to continue from when resume_mode=resume_path."""

    def __post_init__(self) -> None:
        require_number(self, "total_training_steps", low=1, integer=True, fix="Use a positive number of steps.")
        for name in ("test_freq", "save_freq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
                config_error(key_of(self, name), value, "must be a positive integer or -1", "Use -1 to turn it off.")
        require_bool(self, "val_before_train")
        if not isinstance(self.default_local_dir, str) or not self.default_local_dir:
            config_error(
                "trainer.default_local_dir", self.default_local_dir, "must name a directory", "Pass --out DIR."
            )
        require_choice(self, "resume_mode", ResumeMode)
        _require_path_or_none(
            self,
            "resume_from_path",
            "Name a checkpoint directory such as runs/local/checkpoints/global_step_100, or leave it null.",
        )
        if self.resume_mode == ResumeMode.RESUME_PATH and not self.resume_from_path:
            config_error(
                "trainer.resume_from_path",
                self.resume_from_path,
                "is needed when trainer.resume_mode=resume_path",
                "Set it to a checkpoint directory such as runs/local/checkpoints/global_step_100.",
            )


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The tiny randomly initialised Llama policy (vocabulary and positions come from the task)."""

    hidden_size: int = field(default=64, metadata=verl_key("local.model.hidden_size", verl_native=False))
    """Width of the residual stream. Range >= 8; 64 gives about 132k parameters with the other defaults."""

    intermediate_size: int = field(default=256, metadata=verl_key("local.model.intermediate_size", verl_native=False))
    """Width of each MLP. Range >= 1."""

    num_hidden_layers: int = field(default=2, metadata=verl_key("local.model.num_hidden_layers", verl_native=False))
    """Transformer blocks. Range >= 1."""

    num_attention_heads: int = field(default=4, metadata=verl_key("local.model.num_attention_heads", verl_native=False))
    """Attention heads; must divide hidden_size."""

    def __post_init__(self) -> None:
        require_number(self, "hidden_size", low=8, integer=True, fix="64 is the tested default.")
        require_number(self, "intermediate_size", low=1, integer=True, fix="256 is the tested default.")
        require_number(self, "num_hidden_layers", low=1, integer=True, fix="2 is the tested default.")
        require_number(self, "num_attention_heads", low=1, integer=True, fix="4 is the tested default.")
        if self.hidden_size % self.num_attention_heads or (self.hidden_size // self.num_attention_heads) % 2:
            config_error(
                "local.model.num_attention_heads",
                self.num_attention_heads,
                f"must divide local.model.hidden_size={self.hidden_size} into an even head size (rotary embeddings)",
                "Use e.g. 4 heads for hidden_size 64.",
            )


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """The synthetic verifiable task (see :mod:`dapo_verl.local.tasks`)."""

    name: str = field(default="copy3", metadata=verl_key("local.task.name", verl_native=False))
    """Registered task: copy3 (abcd> -> c, learned in a minute), summod (a+b= -> (a+b)%10, slower), summod2 (harder)."""

    heldout_size: int = field(default=200, metadata=verl_key("local.task.heldout_size", verl_native=False))
    """Prompts held out for greedy evaluation and never trained on; 0 evaluates on every prompt, the training prompts
    included (for tasks too small to split, such as summod). Range 0 to the task's size minus 50.
    """

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            config_error("local.task.name", self.name, "must name a registered task", "Use copy3, summod or summod2.")
        require_number(
            self, "heldout_size", low=0, integer=True, fix="200 is the default; 0 evaluates on every prompt."
        )


@dataclass(frozen=True, kw_only=True)
class WarmStartConfig:
    """A short supervised phase before RL that leaves the correct answer unlikely (see :mod:`.warm_start`)."""

    steps: int = field(default=0, metadata=verl_key("local.warm_start.steps", verl_native=False))
    """Supervised steps on the training prompts before the first RL step; 0 (the default) starts RL from the random
    model. Range >= 0.
    """

    correct_prob: float = field(default=0.05, metadata=verl_key("local.warm_start.correct_prob", verl_native=False))
    """Probability the warm-start target gives the correct first answer token; the rest is shared by the task's
    decoy answers (a decoy equal to the answer adds to it). Range (0, 1).
    """

    lr: float = field(default=3e-3, metadata=verl_key("local.warm_start.lr", verl_native=False))
    """AdamW learning rate of the supervised phase (its own optimiser, discarded afterwards). Range > 0."""

    batch_size: int = field(default=64, metadata=verl_key("local.warm_start.batch_size", verl_native=False))
    """Training prompts per supervised step, drawn with replacement. Range >= 1."""

    def __post_init__(self) -> None:
        require_number(self, "steps", low=0, integer=True, fix="Use 0 for no warm start, or e.g. 300.")
        require_number(self, "correct_prob", low=0.0, high=1.0, low_open=True, fix="Use e.g. 0.05.")
        if self.correct_prob >= 1.0:
            config_error(
                key_of(self, "correct_prob"),
                self.correct_prob,
                "must be below 1",
                "1 would leave nothing to explore; use e.g. 0.05.",
            )
        require_number(self, "lr", low=0.0, low_open=True, fix="3e-3 is the tested value.")
        require_number(self, "batch_size", low=1, integer=True, fix="64 is the tested value.")


@dataclass(frozen=True, kw_only=True)
class LocalConfig:
    """What verl has no key for: model, task, device, threads and cache."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The tiny policy."""

    task: TaskConfig = field(default_factory=TaskConfig)
    """The synthetic task."""

    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """The optional supervised phase before RL."""

    device: str = field(default="cpu", metadata=verl_key("local.device", verl_native=False))
    """cpu, cuda, or auto (the GPU if one is visible); the default cpu keeps runs bit-reproducible."""

    num_threads: int = field(default=1, metadata=verl_key("local.num_threads", verl_native=False))
    """torch CPU threads for the run (restored afterwards); 1 is as fast as 2 for the tiny model. Range >= 1."""

    cache_dir: str | None = field(default=None, metadata=verl_key("local.cache_dir", verl_native=False))
    """Where built models are cached; null means $XDG_CACHE_HOME/dapo_verl (~/.cache/dapo_verl)."""

    def __post_init__(self) -> None:
        require_choice(self, "device", Device)
        require_number(self, "num_threads", low=1, integer=True, fix="1 thread is the tested default.")
        _require_path_or_none(self, "cache_dir", "Name a directory, or leave it null for ~/.cache/dapo_verl.")


@dataclass(frozen=True, kw_only=True)
class LocalRunConfig:
    """Everything a local run reads beyond :class:`~dapo_verl.config.DapoConfig`."""

    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Training rollouts."""

    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy update."""

    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights against the sampling policy (``algorithm.rollout_correction``)."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run length and outputs."""

    local: LocalConfig = field(default_factory=LocalConfig)
    """Local-only settings."""


def read_run_config(cfg: Mapping[str, Any], cls: type = LocalRunConfig) -> Any:
    """Build ``cls`` from a composed, resolved config mapping; absent or null keys take the dataclass default.

    Raises:
        ValueError: naming the full key of any invalid value and how to fix it.
    """
    return read_verl_section(cls, cfg)
