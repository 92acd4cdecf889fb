"""verl v1's ``PPOTrainer`` without workers, for driving replay buffers on CPU with :mod:`tools.verl_fakes.v1_rollout`.

* :func:`compose_v1_config` composes dapo_verl's ``dapo_trainer`` config for a small v1 run.
* :class:`SimulatedTrainer` is a verl v1 ``PPOTrainer`` built without workers. Its constructor runs verl's
  ``_build_replay_buffer`` (so a buffer gets exactly verl's keyword arguments, ``refill_fn`` included) and
  then verl's ``_init_dataloader`` over an in-memory dataset (:class:`PromptDataset`), in verl's order. Prompt
  submission (``_add_batch_to_generate``, ``_add_prompts_to_generate``, ``_submit_batch_to_rollout``), the async
  warm-up, checkpointing (``_save_checkpoint``, which calls the checkpoint callback, and ``_load_checkpoint``,
  ``_reissue_inflight_prompts``) and ``step()`` are verl's; ``_step_once`` only samples (no model update).
  :meth:`SimulatedTrainer.train_step` runs one iteration of ``fit()``'s loop in verl's order (step, save, clear
  the trained keys) and records it (:class:`StepRecord`); :meth:`SimulatedTrainer.validate` registers and
  samples one validation batch the way ``_validate`` does (emulated).
"""

from __future__ import annotations

import time
import types
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
import transfer_queue as tq
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
from verl.trainer.ppo.v1 import trainer_base
from verl.utils import tensordict_utils as tu

from dapo_verl.config import CONFIG_DIR as PACKAGE_CONFIGS
from tools.verl_fakes.v1_rollout import SimulatedRollout

__all__ = ["CONFIG_DIR", "PromptDataset", "SimulatedTrainer", "StepRecord", "compose_v1_config"]

CONFIG_DIR = str(PACKAGE_CONFIGS)


def compose_v1_config(tmp_dir: str | Path, *overrides: str, mode: str = "sync") -> DictConfig:
    """dapo_verl's composed ``dapo_trainer`` config (verl's ``ppo_trainer`` underneath) for a small v1 run.

    Args:
        tmp_dir: Checkpoint folder (``trainer.default_local_dir``).
        overrides: Hydra overrides applied last (``data.train_batch_size=4``, ...).
        mode: ``trainer.v1.trainer_mode``.

    Returns:
        The config, with dapo_verl's custom sampler and checkpoint callback set (as ``python -m
        dapo_verl.main`` runs); set ``trainer.v1.sampler.custom_sampler.path=null`` for verl's own buffers.
    """
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(
            "dapo_trainer",
            overrides=[
                "data.train_batch_size=4",
                "data.dataloader_num_workers=0",
                "data.max_response_length=64",
                "actor_rollout_ref.rollout.response_length=64",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "reward.reward_model.enable=False",
                "reward.reward_kwargs.overlong_tokens=16",
                "trainer.total_training_steps=100",
                "trainer.save_freq=-1",
                "trainer.resume_mode=disable",
                f"trainer.default_local_dir={tmp_dir}",
                f"trainer.v1.trainer_mode={mode}",
                *overrides,
            ],
        )


class PromptDataset(torch.utils.data.Dataset):
    """Rows shaped like verl's ``RLHFDataset`` items (what ``collate_fn`` and the agent loop read).

    Row ``i`` has ``index == extra_info["index"] == i``, so the prompt identity the simulated policy keys on is
    the dataset position, as for a dataset prepared with ``dapo-verl prepare-data``.
    """

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        return {
            "raw_prompt": [{"role": "user", "content": f"question {i}"}],
            "data_source": "simulated",
            "reward_model": {"ground_truth": "1", "style": "rule"},
            "extra_info": {"index": i},
            "index": i,
            "tools_kwargs": {},
            "interaction_kwargs": {},
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
        }


@dataclass
class StepRecord:
    """What one training step sampled.

    Attributes:
        step: ``global_steps``.
        slices: The ``(KVBatchMeta, metrics)`` of each ``sample()`` call, in order.
        metrics: The step's metrics as verl aggregates them (``MetricsAggregator`` over the slices).
        sample_s: Wall seconds of each ``sample()`` call minus the simulated rollout's own time in it.
        driver_s: The same for the whole ``step()`` (``prepare_step``'s submission and every ``sample()``).
        waves: Sequential generations the step waited for (:meth:`SimulatedRollout.waves`).
        gen_time: Virtual generation budgets the step took (virtual timing).
        groups: Every trained group: prompt uid -> (prompt index, each trajectory's acc in key order).
    """

    step: int
    slices: list[tuple[KVBatchMeta, dict]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    sample_s: list[float] = field(default_factory=list)
    driver_s: float = 0.0
    waves: int = 0
    gen_time: float = 0.0
    groups: dict[str, tuple[int, list[float]]] = field(default_factory=dict)

    @property
    def keys(self) -> list[str]:
        """Every trajectory key trained this step."""
        return [k for batch, _ in self.slices for k in batch.keys]

    @property
    def prompts(self) -> list[int]:
        """Prompt index of every trained group, in batch order."""
        return [index for index, _ in self.groups.values()]


def _trained_groups(batch: KVBatchMeta) -> dict[str, tuple[int, list[float]]]:
    """uid -> (prompt index, acc of each trajectory) of a sampled batch, read from TQ before the trainer clears it."""
    if not batch.keys:
        return {}
    values = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["index", "extra_fields"])
    groups: dict[str, tuple[int, list[float]]] = {}
    for key, index, extra in zip(batch.keys, list(values["index"]), list(values["extra_fields"]), strict=True):
        info = getattr(extra, "data", extra)["reward_extra_info"]
        groups.setdefault(key.split("_")[0], (int(index), []))[1].append(float(info["acc"]))
    return groups


class SimulatedTrainer(trainer_base.PPOTrainer):
    """A verl v1 ``PPOTrainer`` without workers (see the module docstring).

    Args:
        config: Composed trainer config (:func:`compose_v1_config`); edited in place by verl's
            ``_init_dataloader`` (``data.gen_batch_size``).
        rollout: The simulated agent loop.
        dataset_size: Prompts in the in-memory training dataset.
        resume: Run verl's ``_load_checkpoint`` (``trainer.resume_mode`` decides from where).
        train_budgets: Virtual generation budgets each step's training takes (virtual timing): groups still in
            flight when sampling ends keep generating for that long before the next step begins, as a rollout
            pool does while the trainer trains (``separate_async``). 0 models no overlap.
    """

    def __init__(
        self,
        config: DictConfig,
        rollout: SimulatedRollout,
        *,
        dataset_size: int = 64,
        resume: bool = False,
        train_budgets: float = 0.0,
    ) -> None:
        # Not verl's __init__ (it needs workers): only the parts the replay buffer touches, in verl's order.
        self.config = config
        self.checkpoint_callback = build_checkpoint_callback(config)
        self.use_critic = False
        self.trainer_mode = config.trainer.v1.trainer_mode
        self.parameter_sync_step = config.trainer.v1.get(self.trainer_mode, {}).get("parameter_sync_step", 1)
        self.local_trigger_step = 0
        self._restored_tq_prompt_count = 0
        self.agent_loop_manager = rollout
        self.rollout = rollout
        self.train_budgets = train_budgets  # virtual generation time each step's training takes (0: none)
        self.actor_rollout_wg = types.SimpleNamespace(
            save_checkpoint=lambda *a, **k: None, load_checkpoint=lambda *a, **k: None
        )
        self.checkpoint_manager = types.SimpleNamespace(  # verl's replica controls, on the simulated rollout
            abort_replicas=lambda reject_request=False: rollout.abort(
                keep=self.trainer_mode != "sync", reject_request=reject_request
            ),
            resume_generation_replicas=rollout.resume,
        )
        self.tokenizer = self.processor = None
        self.records: list[StepRecord] = []
        self._current: StepRecord | None = None
        self.replay_buffer = self._build_replay_buffer()  # TB:131, before the dataloader, as verl orders it
        datasets = iter([PromptDataset(dataset_size), PromptDataset(8)])
        with mock.patch.object(trainer_base, "create_rl_dataset", lambda *a, **k: next(datasets)):
            self._init_dataloader()
        self.global_steps = 0
        if resume:
            self._load_checkpoint()

    def begin(self) -> None:
        """What ``fit()`` does before its loop: first step, re-issue restored in-flight prompts, warm-up."""
        self.global_steps += 1
        self._reissue_inflight_prompts()
        self.on_train_begin()

    def on_train_begin(self) -> None:
        """Async modes add their warm-up batches (``trainer_colocate_async`` / ``trainer_separate_async``)."""
        if self.trainer_mode != "sync":
            self._add_async_warmup_batches(self.config.trainer.v1[self.trainer_mode].num_warmup_batches)

    def on_sample_end(self) -> None:
        """As verl's trainers, with thread timing: sync puts the replicas to sleep (refused while a group is still
        generating); colocate_async aborts them (what was generating continues after the weight update)."""
        if self.rollout.timing != "thread":
            return
        if self.trainer_mode == "sync":
            self.rollout.replicas_sleep()
        elif self.trainer_mode == "colocate_async":
            self.checkpoint_manager.abort_replicas()

    def on_step_end(self) -> None:
        """Weight sync (nothing to do without a model); colocate_async then resumes generation."""
        if self.rollout.timing == "thread" and self.trainer_mode == "colocate_async":
            self.checkpoint_manager.resume_generation_replicas()

    def train_step(self) -> StepRecord:
        """One iteration of ``fit()``'s loop (TB:466-531) without the model: step, save, clear the trained keys."""
        record = StepRecord(step=self.global_steps)
        self._current = record
        self.rollout.step = self.global_steps - 1
        start_seq, start_time = self.rollout.sequence(), self.rollout.now
        is_last_step = self.global_steps >= self.total_training_steps
        self.on_step_begin()
        before, started = self.rollout.rollout_s, time.perf_counter()
        batch = self.step(record.metrics, {})
        record.driver_s = time.perf_counter() - started - (self.rollout.rollout_s - before)
        record.waves = self.rollout.waves(start_seq, self.rollout.sequence())
        record.gen_time = self.rollout.now - start_time
        self.rollout.advance(self.train_budgets)  # training: whatever is still generating goes on meanwhile
        save_freq = self.config.trainer.save_freq
        if save_freq > 0 and (is_last_step or self.global_steps % save_freq == 0):
            self._save_checkpoint()
        self.on_step_end()
        record.groups = _trained_groups(batch)
        tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)
        self.records.append(record)
        self.global_steps += 1
        return record

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        """verl's ``_step_once`` up to sampling (TB:562-573); the model part is left out."""
        self.on_sample_begin()
        before = self.rollout.rollout_s
        started = time.perf_counter()
        batch, sample_metrics = self.replay_buffer.sample(
            global_steps=self.global_steps, partition_id="train", batch_size=sample_batch_size
        )
        elapsed = time.perf_counter() - started - (self.rollout.rollout_s - before)
        metrics.update(sample_metrics)
        self.on_sample_end()
        assert self._current is not None
        self._current.slices.append((batch, dict(sample_metrics)))
        self._current.sample_s.append(elapsed)
        return batch

    def validate(self) -> KVBatchMeta:
        """Register, generate and sample one validation batch as ``_validate`` does (TB:1062-1076, emulated).

        The caller clears the returned keys, as ``_validate`` does after scoring.
        """
        batch_dict = next(iter(self.val_dataloader))
        rows = len(batch_dict["raw_prompt"])
        batch_dict["uid"] = np.array([uuid.uuid4().hex for _ in range(rows)], dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", self.global_steps)
        tu.assign_non_tensor_data(batch, "validate", True)
        tags = [{"is_prompt": True, "status": "pending", "global_steps": self.global_steps} for _ in range(len(batch))]
        tq.kv_batch_put(keys=list(batch["uid"]), partition_id="val", tags=tags)
        self.agent_loop_manager.generate_sequences(batch)
        sampled, _ = self.replay_buffer.sample(
            global_steps=self.global_steps, partition_id="val", batch_size=len(batch)
        )
        return sampled

    def set_config(self, key: str, value: Any) -> None:
        """Edit one dotted config key in place (verl's ``_init_dataloader`` leaves the config in struct mode)."""
        *parents, leaf = key.split(".")
        node = self.config
        for part in parents:
            node = node[part]
        with open_dict(self.config):
            node[leaf] = value
