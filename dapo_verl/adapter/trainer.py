"""DAPO inside verl's GRPO trainer: the batch replenisher produces every training batch.

``DapoRayTrainer`` subclasses verl's legacy ``RayPPOTrainer`` (``trainer.use_v1=False``) and does **not**
override ``fit``. It replaces two attributes that ``fit`` only reads, and four small methods:

* ``train_dataloader`` becomes :class:`StepStream`: each item is the prompts of one training batch, which
  the :class:`~dapo_verl.sampler.BatchReplenisher` has *already* generated, scored and filtered (calling
  the real rollout manager as many rounds as needed, while the rollout replicas are awake).
* ``async_rollout_manager`` becomes :class:`ReplayingRolloutManager`: when ``fit`` asks it to generate for
  those prompts it hands back the responses generated for them (after optional overlong filtering);
  validation requests pass through to the real manager.
* ``_create_dataloader`` builds the stream and makes the run length and the LR schedule count *training
  steps* (verl counts dataloader batches, which under dynamic sampling are generation batches, verl#991);
  ``_update_actor`` adds the sampler's and the overlong metrics of the step to the actor's metrics (the
  only per-step metrics dict ``fit`` merges from a method); ``_save_checkpoint``/``_load_checkpoint``
  store the sampler state (carried groups, prompt history, counters, RNG) next to verl's checkpoint, in a
  pickle-free file.

Everything from old log-probs on -- balance, reference, advantage, update, validation, logging,
checkpoint cadence -- is verl's own code, unchanged. The groups ``fit`` sees are group-contiguous (``n``
interleaved responses per prompt), so its fresh ``uid`` per prompt groups them correctly.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from omegaconf import open_dict
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

from dapo_verl.adapter.dataproto_codec import DataProtoCodec
from dapo_verl.adapter.legacy_feed import ReplayingRolloutManager, StepStream
from dapo_verl.adapter.reward import overlong_metrics
from dapo_verl.adapter.transforms import apply_overlong_filtering, no_op_groups, response_truncation
from dapo_verl.config import DapoConfig
from dapo_verl.sampler import BatchReplenisher, GroupResult
from dapo_verl.state_io import load_state, save_state

__all__ = ["SAMPLER_STATE_FILE", "DapoRayTrainer", "ReplayingRolloutManager", "StepStream", "canonical_group_rows"]

logger = logging.getLogger(__name__)

SAMPLER_STATE_FILE = "dapo_sampler.safetensors"
"""Name of the sampler state file inside verl's ``global_step_<k>`` checkpoint folder."""

_SHAPED_METRICS = ("reward", "seq_reward", "seq_final_reward")
_MAX_EMPTY_BATCHES = 3


class DapoRayTrainer(RayPPOTrainer):
    """verl's GRPO trainer with DAPO's dynamic sampling (see the module docstring)."""

    # -- construction --------------------------------------------------------------------------------

    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler) -> None:
        super()._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)
        if self.config.data.get("sampler", {}).get("class_path"):
            raise ValueError(
                "data.sampler.class_path is set, but with dapo_verl the batch replenisher chooses the prompts. "
                "Remove data.sampler.class_path (curricula are not supported with dynamic sampling yet)."
            )
        from verl.utils.dataset.rl_dataset import collate_fn as default_collate_fn

        self.dapo_config = DapoConfig.from_verl(self.config)
        if self.dapo_config.sampler.streaming:
            raise ValueError(
                "algorithm.filter_groups.streaming=true needs verl's v1 trainer (trainer.use_v1=true, "
                "trainer_mode sync or colocate_async): this trainer's generate_sequences returns whole "
                "rounds, so there is nothing to stream or abort. Set streaming=false or use_v1=true."
            )
        self._collate = collate_fn or default_collate_fn
        self.sampler = BatchReplenisher(
            self.dapo_config.sampler,
            len(self.train_dataset),
            self._generate_groups,
            codec=_GroupCodec(),
            shuffle=bool(self.config.data.get("shuffle", True)),
        )
        self._pending: tuple[DataProto, dict[str, float]] | None = None
        self._padding_responses = 0
        self._step_metrics: dict[str, float] = {}
        epochs = max(int(self.config.trainer.total_epochs), 1)
        total = self.config.trainer.total_training_steps or (
            len(self.train_dataset) // self.dapo_config.sampler.train_batch_size * epochs
        )
        self.total_training_steps = int(total)
        with open_dict(self.config):
            self.config.actor_rollout_ref.actor.optim.total_training_steps = self.total_training_steps
        self.train_dataloader = StepStream(self, steps_per_epoch=math.ceil(self.total_training_steps / epochs))
        with open_dict(self.config):
            # fit loops over range(epoch, total_epochs) while StepStream ends one iteration per data pass; the run
            # still ends at total_training_steps, so the epoch loop must never run out first.
            self.config.trainer.total_epochs = max(epochs, self.total_training_steps + 1)
        logger.info(
            "dapo_verl: %d training steps; the sampler visits the %d prompts as often as needed.",
            self.total_training_steps,
            len(self.train_dataset),
        )

    def init_workers(self) -> None:
        super().init_workers()
        self.attach_dynamic_sampling()

    def attach_dynamic_sampling(self) -> None:
        """Put :class:`ReplayingRolloutManager` in front of ``async_rollout_manager`` (idempotent)."""
        if not isinstance(self.async_rollout_manager, ReplayingRolloutManager):
            self.async_rollout_manager = ReplayingRolloutManager(self, self.async_rollout_manager)

    # -- producing a training batch ------------------------------------------------------------------

    def _next_training_prompts(self) -> dict[str, Any]:
        for _ in range(_MAX_EMPTY_BATCHES):
            start = time.perf_counter()
            self._padding_responses = 0
            sampled = self.sampler.next_batch()
            if sampled.groups:
                payloads = [g.payload for g in sampled.groups]
                prompt_ids = [g.prompt_id for g in sampled.groups]
                padding = -len(payloads) % self._group_multiple()  # only a partial batch needs any
                if padding:
                    payloads.append(no_op_groups(payloads[0], padding))
                    prompt_ids += [prompt_ids[0]] * padding
                metrics = {
                    **sampled.metrics,
                    "timing_s/dapo_sampling": time.perf_counter() - start,
                    "dapo/rollout/padding_responses": self._padding_responses,
                    "dapo/rollout/padding_groups": padding,
                }
                self._pending = (DataProto.concat(payloads), metrics)
                self._stop_if_exhausted()
                return self._collate([self.train_dataset[i] for i in prompt_ids])
            logger.warning("Dynamic sampling found no informative group for step %d; sampling again.", sampled.step)
        raise RuntimeError(
            f"Dynamic sampling found no informative group in {_MAX_EMPTY_BATCHES} attempts of "
            f"{self.dapo_config.sampler.max_num_gen_batches} rounds each: every group was all-correct or all-wrong. "
            f"Check the reward function and data, or raise algorithm.filter_groups.max_num_gen_batches."
        )

    def _stop_if_exhausted(self) -> None:
        """``algorithm.filter_groups.stop_when_exhausted``: make this step the last (checkpoint and validation
        included) once the sampler reports the prompt pool exhausted. ``fit`` reads ``total_training_steps`` right
        after taking the batch."""
        if self.dapo_config.sampler.stop_when_exhausted and self.sampler.pool_exhausted:
            logger.info(
                "dapo_verl: step %d is the last: %.0f%% of the prompt pool is exhausted "
                "(algorithm.filter_groups.stop_when_exhausted).",
                self.global_steps,
                100 * self.sampler.stream.history.exhausted_fraction,
            )
            self.total_training_steps = self.global_steps

    def _group_multiple(self) -> int:
        """Groups a batch must be a multiple of: whole mini-batches, rows that split over the DP ranks, and
        per-rank rows that split into the log-prob micro-batches (verl's ``prepare_micro_batches`` asserts it
        when ``log_prob_use_dynamic_bsz`` is off; a full batch satisfies it by verl's config checks)."""
        config = self.config.actor_rollout_ref
        n = int(config.rollout.n)
        dp = self._get_dp_size(self.actor_rollout_wg, "actor")
        multiple = math.lcm(int(config.actor.ppo_mini_batch_size), dp // math.gcd(dp, n))
        for part in (config.rollout, config.ref):
            micro = part.get("log_prob_micro_batch_size_per_gpu")
            if micro and not part.get("log_prob_use_dynamic_bsz", False):
                rows = dp * int(micro)  # rows of one micro-batch on every rank
                multiple = math.lcm(multiple, rows // math.gcd(rows, n))
        return multiple

    def _replay_rollout(self, rows: int) -> DataProto:
        if self._pending is None:
            raise RuntimeError("The rollout manager was asked to generate before the sampler prepared a batch.")
        rollout, metrics = self._pending
        self._pending = None
        if len(rollout) != rows:
            raise RuntimeError(f"fit asked for {rows} responses but the sampler prepared {len(rollout)}.")
        if self.dapo_config.overlong.overlong_filtering:
            metrics.update(apply_overlong_filtering(rollout, self.tokenizer.eos_token_id))
        self._step_metrics = metrics
        # fit merges this dict into its timers while its "gen" and "step" timers run, and those timers add
        # their own time on exit: so timing_s/gen, timing_s/step and perf/throughput (tokens / step time)
        # count the sampler's generation rounds, which ran in next(train_dataloader) before fit's timers.
        sampling_s = metrics["timing_s/dapo_sampling"]
        rollout.meta_info["timing"] = {"gen": sampling_s, "step": sampling_s}
        return rollout

    def _generate_groups(self, prompt_ids: Sequence[int]) -> list[GroupResult]:
        """The sampler's generate callback: one real rollout for ``prompt_ids``, split into groups."""
        rows = self._collate([self.train_dataset[i] for i in prompt_ids])
        batch = DataProto.from_single_dict(rows)
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in prompt_ids], dtype=object)
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        gen_batch = self._get_gen_batch(batch)
        gen_batch.meta_info["global_steps"] = self.global_steps
        n = self.config.actor_rollout_ref.rollout.n
        manager = getattr(self.async_rollout_manager, "real", self.async_rollout_manager)
        # verl's agent-loop manager splits the rows evenly over its workers and refuses a remainder
        # (DataProto.chunk); pad with copies of the first rows, as verl's _validate does, and keep n responses
        # per prompt (see padded_rows_to_keep).
        request, pad = pad_dataproto_to_divisor(
            gen_batch.repeat(repeat_times=n, interleave=True), _agent_loop_workers(manager, self.config)
        )
        generated = manager.generate_sequences(request)
        if pad:
            real = len(request) - pad
            keep = padded_rows_to_keep(generated.batch["responses"], _response_lengths(generated), real=real, n=n)
            output = generated.select_idxs(keep)
        else:
            output = generated
        self._padding_responses += pad
        output.meta_info.pop("timing", None)
        drop = [key for key in output.non_tensor_batch if key in rows or key == "uid"]
        if drop:
            output.pop(non_tensor_batch_keys=drop)
        metric = self._metric_values(output)  # (P * n,)
        scores = output.batch["rm_scores"].sum(dim=-1)
        responses = output.batch["responses"]
        lengths = _response_lengths(output)
        truncated = response_truncation(output, self.tokenizer.eos_token_id)
        groups = []
        for j, prompt_id in enumerate(prompt_ids):
            rows = canonical_group_rows(responses, lengths, start=j * n, size=n)  # prompt j's n responses
            groups.append(
                GroupResult(
                    prompt_id=int(prompt_id),
                    metric=metric[rows],
                    response_lengths=lengths[rows],
                    truncated=truncated[rows],
                    scores=scores[rows],
                    payload=output.select_idxs(rows),
                )
            )
        return groups

    def _metric_values(self, output: DataProto) -> torch.Tensor:
        key = self.dapo_config.sampler.metric
        if key in output.non_tensor_batch:
            return torch.as_tensor(np.asarray(output.non_tensor_batch[key], dtype=np.float64))
        if key in _SHAPED_METRICS:
            logger.warning(
                "algorithm.filter_groups.metric=%s filters on the shaped reward: groups that are all "
                "wrong but differ in length pass the filter. Prefer metric=acc.",
                key,
            )
            return output.batch["rm_scores"].sum(dim=-1).to(torch.float64)
        raise ValueError(
            f"algorithm.filter_groups.metric={key!r} is not in the rollout output (available: "
            f"{sorted(output.non_tensor_batch)}); the reward manager must report it per response. Use acc with "
            f"reward.reward_manager.name=dapo_verl."
        )

    # -- metrics and checkpoints -----------------------------------------------------------------------

    def _update_actor(self, batch: DataProto) -> DataProto:
        output = super()._update_actor(batch)
        output.meta_info["metrics"].update({**self._step_metrics, **overlong_metrics(batch.non_tensor_batch)})
        return output

    def _save_checkpoint(self) -> None:
        super()._save_checkpoint()
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        save_state(self.sampler.state_dict(), os.path.join(folder, SAMPLER_STATE_FILE))

    def _resume_folder(self) -> str | None:
        """The checkpoint folder ``RayPPOTrainer._load_checkpoint`` will resume from (same rules), or None."""
        mode = self.config.trainer.resume_mode
        if mode == "disable":
            return None
        if mode == "resume_path":
            return os.path.abspath(self.config.trainer.resume_from_path)
        from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

        return find_latest_ckpt_path(os.path.abspath(self.config.trainer.default_local_dir))

    def _load_checkpoint(self):
        folder = self._resume_folder()
        if folder is not None:
            _refuse_unsafe_pickle(os.path.join(folder, "data.pt"))
        result = super()._load_checkpoint()
        if folder is None or self.global_steps == 0:
            return result
        path = os.path.join(folder, SAMPLER_STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"Resuming from {folder} but it has no {SAMPLER_STATE_FILE}: it was not written by dapo_verl's "
                f"trainer, so carried groups and prompt history cannot be restored. Resume from a dapo_verl "
                f"checkpoint or set trainer.resume_mode=disable."
            )
        self.sampler.load_state_dict(load_state(path))
        self.train_dataloader.resume_at(self.global_steps, self.sampler.stream.epoch)
        logger.info("dapo_verl: restored the sampler state from %s", path)
        return result


def _refuse_unsafe_pickle(path: str) -> None:
    """verl loads ``data.pt`` with ``torch.load(weights_only=False)``; refuse one that needs more than that.

    ``weights_only=True`` unpickles tensors and plain containers only, so a planted payload fails here instead
    of running inside verl's loader.
    """
    if not os.path.exists(path):
        return
    try:
        torch.load(path, weights_only=True)
    except Exception as err:
        raise ValueError(
            f"Refusing to resume from {path}: it holds pickled objects beyond tensors and plain containers, "
            f"which verl's loader would execute ({type(err).__name__}). Restore the file from a trusted copy or "
            f"delete it (the sampler state lives in {SAMPLER_STATE_FILE})."
        ) from None


def _agent_loop_workers(manager: Any, config: Any) -> int:
    """How many agent-loop workers verl's rollout manager splits a request over."""
    workers = getattr(manager, "agent_loop_workers", None)
    return len(workers) if workers else max(1, int(config.actor_rollout_ref.rollout.agent.num_workers))


def _response_lengths(output: DataProto) -> torch.Tensor:
    responses = output.batch["responses"]
    return output.batch["attention_mask"][:, -responses.shape[-1] :].sum(dim=-1)


def padded_rows_to_keep(responses: torch.Tensor, lengths: torch.Tensor, *, real: int, n: int) -> torch.Tensor:
    """Rows to keep from a rollout padded with copies of its first rows: n per prompt, chosen by content.

    Pad row ``real + k`` repeats the request of row ``k % real``, so its response is one more sample for that
    row's prompt. A rollout engine sees identical requests and answers them in whatever order they finish;
    dropping "the pad rows" would drop an arbitrary one of the prompt's samples. Keeping, for each prompt, the
    n samples whose token bytes hash lowest makes the kept responses a function of the responses generated
    (so a resumed run repeats the uninterrupted one), and a hash favours neither short nor long responses.

    Args:
        responses: (real + pad, L) response token ids, pad rows last.
        lengths: (real + pad,) valid response tokens per row.
        real: Rows before padding (prompts x n, interleaved: prompt j owns rows j*n .. j*n + n - 1).
        n: Responses per prompt.

    Returns:
        (real,) int64 row indices, n per prompt, prompts in order.
    """

    def digest(row: int) -> bytes:
        return hashlib.blake2b(responses[row, : int(lengths[row])].numpy().tobytes(), digest_size=8).digest()

    extra: dict[int, list[int]] = {}
    for row in range(real, len(responses)):
        extra.setdefault(((row - real) % real) // n, []).append(row)
    keep: list[int] = []
    for prompt in range(real // n):
        candidates = [*range(prompt * n, prompt * n + n), *extra.get(prompt, [])]
        keep.extend(sorted(candidates, key=lambda row: (digest(row), row))[:n])
    return torch.tensor(keep, dtype=torch.int64)


def canonical_group_rows(responses: torch.Tensor, lengths: torch.Tensor, *, start: int, size: int) -> torch.Tensor:
    """Row indices of one group's responses, ``start`` .. ``start + size``, in a canonical order.

    A rollout engine returns a prompt's n responses in the order its concurrent requests finished, and verl's
    batch balancing breaks ties between equal lengths by position; ordering each group by (length, tokens)
    makes the batch -- and so every mini-batch -- a function of the responses alone, so a resumed run
    repeats the uninterrupted one. Indexing with these rows also copies the group out of its round's
    tensors (a slice would be a view that keeps the whole round alive).

    Args:
        responses: (B, L) response token ids of the round.
        lengths: (B,) valid response tokens per row.
        start: First row of the group.
        size: Rows in the group (n).

    Returns:
        (size,) int64 row indices.
    """
    rows = range(start, start + size)
    # The tokens' raw bytes: a memcpy per row, not a Python int per token (responses run to 20k tokens).
    keys = {row: (int(lengths[row]), responses[row, : int(lengths[row])].numpy().tobytes()) for row in rows}
    return torch.tensor(sorted(rows, key=keys.__getitem__), dtype=torch.int64)


class _GroupCodec(DataProtoCodec):
    """Carried groups' payloads are ``DataProto`` slices."""
