"""Dynamic sampling in verl's v1 trainer: dapo_verl's batch replenisher as verl's custom replay buffer.

verl 0.9's v1 trainer (``trainer.use_v1=true``, its default) takes a custom sampler through
``trainer.v1.sampler.custom_sampler.{path,name}``: a replay-buffer class whose ``sample()`` returns the
trajectory keys (in TransferQueue) of each training batch. :class:`DapoReplayBuffer` is that class, and every
decision in it is made by the same engine-agnostic :class:`~dapo_verl.sampler.BatchReplenisher` the legacy
trainer and the local backend use -- which prompts, how many per round, filtering on raw correctness, the
round limit and ``on_shortfall``, carried surplus and its staleness, history skipping, accounting, metrics:

* ``sample(partition_id="train")`` runs one ``next_batch()`` per training step. Its generate callback
  submits the replenisher's prompt ids through the trainer's own ``_submit_batch_to_rollout`` (rows read from
  the trainer's dataset by index, so the prompt identity is the dataset position), waits until verl's agent
  loop has published every group as finished, and reads each response's ``acc``, score, length and truncation
  from TransferQueue (:mod:`dapo_verl.adapter.v1_groups`). The trainer's per-step baseline submission
  (``_add_batch_to_generate``) is switched off: the replenisher submits exactly what it decided, and with rounds
  nothing of it is still generating when ``sample()`` returns (replicas may sleep).
* With ``algorithm.filter_groups.streaming=true`` (``sync`` and ``colocate_async``) the replenisher drives verl's
  agent loop as a streaming engine (:mod:`dapo_verl.adapter.v1_engine`) instead of through rounds: it counts groups
  as verl publishes them, tops up what is in flight as groups are dropped, and ``sample()`` returns the moment the
  batch is full. In ``colocate_async`` what is still generating is left to verl, which aborts it after the sample
  and continues it after the weight update; the replenisher carries those groups and follows them first at the next
  step (``surplus=carry`` is required there), and a step that a checkpoint follows lets them finish instead,
  because verl restarts a checkpointed in-flight prompt from scratch and the resumed run would differ. In ``sync``
  the engine aborts them on the replicas, and they are discarded.
* With ``trainer.v1.parameter_sync_step > 1`` the step's groups are served in that many slices; the
  sampler's metrics come with the first slice only, so verl's per-step aggregation never averages a counter.
* Dropped groups (uninformative, surplus, stale) are cleared from TransferQueue; selected groups' prompt keys
  are cleared here and their trajectories by the trainer after the step, as verl's own buffers do.
* Validation (``partition_id="val"``) passes through verl's ``ReplayBufferAsync`` untouched.
* State: :class:`DapoCheckpointCallback` (``trainer.checkpoint_callback_class``) saves the replenisher's state
  next to verl's checkpoint. A resume restores it as soon as verl's ``_load_checkpoint`` has loaded the step, before
  ``fit()`` derives its epoch from the step count (so the first resumed step carries the data epoch's label, and a
  run resumed past ``len(dataset) // train_batch_size`` steps still enters verl's loop); what it holds in
  TransferQueue is reconciled at the first ``sample()``, once verl has re-issued its in-flight prompts. In
  ``sync`` mode verl does not checkpoint TransferQueue, so a step that will be checkpointed carries no surplus
  (it is counted as dropped ``surplus``) and a resumed run repeats the uninterrupted one; in the async modes
  TransferQueue itself is checkpointed and carried groups survive.

The same class serves ``sync``, ``colocate_async`` and ``separate_async``; for
separate_async's hybrid switching it answers ``get_sampleable_count`` (groups of the asked step that need no more
generation: carried fresh ones and finished informative ones of the prefetched round) and ``wait_for_sampleable``
(builds the step's batch while verl's GPUs are lent). In ``separate_async`` the rollout replicas are a pool of their
own that keeps generating while the trainer trains, so at the end of each step's sampling the buffer submits the
*next* step's first round (:meth:`~dapo_verl.sampler.BatchReplenisher.plan_next_round`: the very prompts the next
step would choose when it starts); it generates during this step's training, on weights one step old -- verl's
one-step-off-policy overlap -- and the next ``sample()`` finds it finished or nearly so. The plan and its prompt keys
are saved with the sampler state; TransferQueue is checkpointed in async modes and verl re-issues in-flight prompts
on resume, so a resumed run waits for the same round. ``sampler_kwargs.prefetch: false`` turns it off.
``colocate_async`` does not prefetch: its replicas are aborted and put to sleep as soon as a step's sampling ends,
so a round submitted then could not generate until the next weight update anyway.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np
import transfer_queue as tq
from omegaconf import open_dict
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.checkpoint_callback import CheckpointCallback
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync
from verl.utils import tensordict_utils as tu

from dapo_verl.adapter.epochs import epoch_divisor
from dapo_verl.adapter.reward import overlong_metrics
from dapo_verl.adapter.v1_engine import AgentLoopEngine
from dapo_verl.adapter.v1_groups import GroupKeys, GroupKeysCodec, read_round, train_listing, wait_terminal
from dapo_verl.adapter.v1_settings import check_off_policy_span, check_streaming
from dapo_verl.config import DapoConfig
from dapo_verl.sampler import BatchReplenisher, GroupResult
from dapo_verl.sampler.verdicts import is_kept
from dapo_verl.state_io import load_state, save_state

__all__ = ["SAMPLER_STATE_FILE", "DapoCheckpointCallback", "DapoReplayBuffer", "GroupKeys"]

logger = logging.getLogger(__name__)

SAMPLER_STATE_FILE = "dapo_sampler.safetensors"
"""The replenisher's state inside verl's ``global_step_<k>`` folder (the legacy trainer uses the same name)."""

_DEFAULT_POLL_S = 0.05


class DapoReplayBuffer(ReplayBufferAsync):
    """verl v1 custom sampler driven by dapo_verl's batch replenisher (see the module docstring).

    verl constructs it with its custom-sampler keyword arguments; ``refill_fn`` is the trainer's bound
    ``_add_prompts_to_generate``, through which the buffer reaches the trainer. ``sampler_kwargs`` may set
    ``poll_interval`` (seconds between TransferQueue polls while a round generates; default 0.05) and
    ``prefetch`` (submit the next step's first round while this step trains, ``separate_async`` only; default
    true).
    """

    def __init__(
        self,
        trainer_mode: str,
        trainer_config: Any,
        max_off_policy_threshold: int | None = None,
        max_off_policy_strategy: str = "drop",
        sampler_kwargs: Any = None,
        refill_fn: Any = None,
    ) -> None:
        poll = float((sampler_kwargs or {}).get("poll_interval", _DEFAULT_POLL_S))
        super().__init__(
            trainer_mode=trainer_mode,
            trainer_config=trainer_config,
            max_off_policy_threshold=max_off_policy_threshold,
            max_off_policy_strategy=max_off_policy_strategy,
            sampler_kwargs=sampler_kwargs,
            poll_interval=poll,
            refill_fn=refill_fn,
        )
        trainer = getattr(refill_fn, "__self__", None)
        if trainer is None:
            raise TypeError(
                "DapoReplayBuffer needs verl's refill_fn (the trainer's bound _add_prompts_to_generate); "
                "set it as trainer.v1.sampler.custom_sampler in the config, not by hand."
            )
        self.trainer = trainer
        # Read now: verl's v1 trainer later forces data.gen_batch_size=1 in its config (TB _init_dataloader)
        # for its own one-prompt refills; the replenisher's rounds keep the recipe's gen_batch_size.
        self.dapo = DapoConfig.from_verl(trainer.config)
        # The replenisher submits its own rounds; verl's fixed per-step submission and its async warm-up would
        # add prompts from verl's dataloader that the replenisher never asked for and would never train on.
        trainer._add_batch_to_generate = _no_submission
        trainer._add_async_warmup_batches = _no_submission
        trainer._load_checkpoint = self._restoring_after(trainer._load_checkpoint)
        self._replenisher: BatchReplenisher | None = None
        self._served_step: int | None = None
        self._step_groups: list[GroupResult] = []
        self._step_metrics: dict[str, float] = {}
        self._served_in_step = 0  # slices of the current step served so far
        self._step_uids: list[str] = []
        self._prefetch = trainer_mode == "separate_async" and bool((sampler_kwargs or {}).get("prefetch", True))
        self._inflight: tuple[tuple[int, ...], list[str]] | None = None  # next step's first round: (prompt ids, uids)
        self._restored_inflight: list[str] | None = None  # saved prompt keys to reconcile with TransferQueue
        self._verdicts: dict[str, bool] = {}  # prompt key -> informative, for finished groups of the prefetched round
        self._abandoned: set[str] = set()  # prompt keys dropped while verl may still generate them (colocate_async)
        self._engine: AgentLoopEngine | None = None
        check_off_policy_span(trainer_mode, self.dapo.sampler, max_off_policy_threshold, prefetch=self._prefetch)
        check_streaming(trainer_mode, self.dapo.sampler)

    # -- verl's sampler interface ------------------------------------------------------------------------

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[KVBatchMeta, dict]:
        """The next ``batch_size`` groups of step ``global_steps`` (see the module docstring)."""
        if partition_id != "train":
            return super().sample(global_steps, partition_id, batch_size)
        self._prepare(global_steps)
        if not self._step_groups:
            rounds = self.dapo.sampler.max_num_gen_batches
            if not self._served_in_step:
                raise RuntimeError(
                    f"Step {global_steps}: on_shortfall=partial found no informative group in "
                    f"algorithm.filter_groups.max_num_gen_batches={rounds} rounds, so there is nothing to train "
                    f"(every group was all-correct or all-wrong). Raise max_num_gen_batches, check the reward, or "
                    f"use on_shortfall=error to stop with the sampler's figures."
                )
            updates = getattr(self.trainer, "parameter_sync_step", 1)
            raise RuntimeError(
                f"Step {global_steps}: nothing left to serve for another of its {updates} updates; "
                f"on_shortfall=partial found fewer groups than updates. Lower "
                f"trainer.v1.separate_async.parameter_sync_step or use on_shortfall=error."
            )
        self._served_in_step += 1
        served, self._step_groups = self._step_groups[:batch_size], self._step_groups[batch_size:]
        payloads: list[GroupKeys] = [g.payload for g in served]
        tq.kv_clear(partition_id="train", keys=[p.uid for p in payloads])  # the trainer clears the trajectories
        metrics, self._step_metrics = self._step_metrics, {}
        keys = [k for p in payloads for k in p.keys]
        tags = [t for p in payloads for t in p.tags]
        metrics.update(self._overlong_metrics(keys))
        return KVBatchMeta(partition_id="train", keys=keys, tags=tags), metrics

    @staticmethod
    def _overlong_metrics(keys: list[str]) -> dict[str, float]:
        """``dapo/overlong/*`` of the served responses, from the reward manager's extra info (as in the legacy path)."""
        if not keys:
            return {}
        extras = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["extra_fields"])["extra_fields"]
        infos = [(getattr(e, "data", e) or {}).get("reward_extra_info", {}) for e in extras]
        if not all("overlong_penalty" in info for info in infos):
            return {}
        return overlong_metrics(
            {name: np.array([info[name] for info in infos]) for name in ("overlong_penalty", "truncated")}
        )

    # -- one training step -------------------------------------------------------------------------------

    def _prepare(self, global_steps: int) -> None:
        if self._served_step == global_steps:
            return
        replenisher = self._ensure_replenisher(global_steps)
        if self._restored_inflight is not None:
            inflight, self._restored_inflight = self._restored_inflight, None
            self._clear_orphans(keep=set(inflight))
            self._resume_inflight(inflight)
        if self._step_groups:
            raise RuntimeError(
                f"Step {self._served_step} left {len(self._step_groups)} groups unserved; verl's "
                f"trainer asked for fewer than train_batch_size. This is a dapo_verl bug."
            )
        before = self._live_uids()  # the last step's groups are all served: what it carried
        self._step_uids = []
        # verl re-generates a checkpointed in-flight prompt from scratch, so a checkpointed step leaves none in flight
        settle = self._engine is not None and self._engine.resumes_partials and self._checkpoint_follows(global_steps)
        sampled = replenisher.next_batch(settle=settle)
        metrics = dict(sampled.metrics)
        if self._checkpoint_follows(global_steps) and self.trainer_mode == "sync" and replenisher.carried:
            metrics["dapo/sampler/dropped/surplus"] += replenisher.drop_carried("surplus")
            metrics["dapo/sampler/carried_groups"] = 0
        self._step_groups = list(sampled.groups)
        kept = self._live_uids()
        self._abandon([uid for uid in [*before, *self._step_uids] if uid not in kept])
        self._served_in_step = 0
        self._step_metrics = metrics
        self._served_step = global_steps
        self._follow_data_epochs(global_steps)
        if self.dapo.sampler.stop_when_exhausted and replenisher.pool_exhausted:
            # The trainer has already decided whether this step is the last, so the next one is: it still gets
            # the final checkpoint and validation.
            self.trainer.total_training_steps = min(self.trainer.total_training_steps, global_steps + 1)
            logger.info(
                "dapo_verl: step %d will be the last: %.0f%% of the prompt pool is exhausted "
                "(algorithm.filter_groups.stop_when_exhausted).",
                global_steps + 1,
                100 * replenisher.stream.history.exhausted_fraction,
            )
        if self._prefetch and global_steps < int(getattr(self.trainer, "total_training_steps", 0) or 0):
            prompt_ids = replenisher.plan_next_round()
            if prompt_ids:
                self._inflight = (tuple(prompt_ids), self._submit(prompt_ids))

    def _follow_data_epochs(self, global_steps: int) -> None:
        """Make the v1 trainer's epoch label and loop follow the sampler's passes over the data.

        The trainer labels the next step ``global_steps // trainer.steps_per_epoch`` and stops at
        ``trainer.total_epochs`` of those, with ``steps_per_epoch = len(dataset) // train_batch_size``: a step
        count that dynamic sampling does not keep (the paper recipe would stop after 33 of its 1166 steps). The
        divisor is set so the label is the data epoch, and the run ends at ``trainer.total_training_steps``.
        """
        assert self._replenisher is not None
        self.trainer.steps_per_epoch = epoch_divisor(global_steps, self._replenisher.stream.epoch)
        trainer_config = self.trainer.config.trainer
        limit = int(getattr(self.trainer, "total_training_steps", 0) or 0) + 1
        if int(trainer_config.total_epochs) < limit:
            with open_dict(self.trainer.config):
                trainer_config.total_epochs = limit

    def _live_uids(self) -> list[str]:
        """Prompt keys of our groups TransferQueue still holds: carried (finished or aborted) and not yet served."""
        replenisher = self._replenisher
        carried = [] if replenisher is None else [g.payload for _, g in replenisher.carried]
        aborted = [] if replenisher is None else [p.payload for _, p in replenisher.carried_aborted]
        return [payload.uid for payload in [*carried, *aborted, *(g.payload for g in self._step_groups)]]

    def _checkpoint_follows(self, global_steps: int) -> bool:
        trainer_config = self.trainer.config.trainer
        save_freq = int(trainer_config.save_freq)
        last = global_steps >= int(getattr(self.trainer, "total_training_steps", global_steps + 1))
        return save_freq > 0 and (last or global_steps % save_freq == 0)

    def _clear(self, uids: Sequence[str], listing: dict[str, dict] | None = None) -> None:
        if not uids:
            return
        listing = train_listing() if listing is None else listing
        wanted = set(uids)
        keys = [key for key in listing if key.split("_")[0] in wanted]
        tq.kv_clear(partition_id="train", keys=keys)

    def _abandon(self, uids: Sequence[str]) -> None:
        """Clear dropped groups; one verl is still generating (an aborted group dropped as stale in colocate_async,
        which verl continues regardless) is cleared once it finishes, at a later step."""
        self._abandoned.update(uids)
        if not self._abandoned:
            return
        listing = train_listing()
        running = {uid for uid in self._abandoned if listing.get(uid, {}).get("status") in ("pending", "running")}
        self._clear(sorted(self._abandoned - running), listing)
        self._abandoned = running

    # -- the replenisher and its generate callback ----------------------------------------------------------

    def _ensure_replenisher(self, global_steps: int) -> BatchReplenisher:
        if self._replenisher is not None:
            return self._replenisher
        config = self.trainer.config
        generate = self._generate_groups if not self.dapo.sampler.streaming else self._streaming_engine()
        self._replenisher = BatchReplenisher(
            self.dapo.sampler,
            len(self.trainer.train_dataset),
            generate,
            codec=GroupKeysCodec(),
            shuffle=bool(config.data.get("shuffle", True)),
        )
        if global_steps > 1:
            self._restore(global_steps)
        return self._replenisher

    def _streaming_engine(self) -> AgentLoopEngine:
        """verl's agent loop as a streaming engine (:mod:`dapo_verl.adapter.v1_engine`): verl continues what is still
        generating in colocate_async; in sync the engine aborts it on the replicas and it is discarded."""
        rollout = self.trainer.config.actor_rollout_ref.rollout
        replicas = self.trainer.checkpoint_manager
        aborts = (
            None
            if self.trainer_mode == "colocate_async"
            else (replicas.abort_replicas, replicas.resume_generation_replicas)
        )
        self._engine = AgentLoopEngine(
            self._submit_step,
            self._read_groups,
            group_size=int(rollout.n),
            poll_interval=self.poll_interval,
            abort_replicas=aborts,
        )
        return self._engine

    def _submit_step(self, prompt_ids: Sequence[int]) -> list[str]:
        uids = self._submit(prompt_ids)
        self._step_uids.extend(uids)
        return uids

    def _read_groups(
        self, prompt_ids: Sequence[int], uids: Sequence[str], listing: dict[str, dict]
    ) -> list[GroupResult]:
        assert self._replenisher is not None
        return read_round(
            prompt_ids,
            uids,
            listing,
            metric=self._replenisher.config.metric,
            response_length=int(self.trainer.config.actor_rollout_ref.rollout.response_length),
        )

    def _generate_groups(self, prompt_ids: Sequence[int]) -> list[GroupResult]:
        """Submit ``prompt_ids`` to verl's agent loop and wait for their groups (the replenisher's callback).

        The round is read with one TransferQueue listing, indexed by prompt key once, and one ``kv_batch_get``
        of every session's last output: the driver's cost grows with the round, not with its square.
        """
        uids = self._take_inflight(prompt_ids) or self._submit(prompt_ids)
        self._step_uids.extend(uids)
        return self._read_groups(prompt_ids, uids, wait_terminal(uids, self.poll_interval))

    def _submit(self, prompt_ids: Sequence[int]) -> list[str]:
        """Hand ``prompt_ids`` to verl's agent loop under fresh prompt keys; return the keys."""
        uids = [uuid.uuid4().hex for _ in prompt_ids]  # no "_": verl splits keys on it
        self.trainer._submit_batch_to_rollout(self._prompt_batch(prompt_ids, uids))
        return uids

    def _prompt_batch(self, prompt_ids: Sequence[int], uids: list[str]) -> Any:
        from verl.utils.dataset.rl_dataset import collate_fn

        rows = [self.trainer.train_dataset[int(i)] for i in prompt_ids]
        batch_dict = collate_fn(rows)
        batch_dict["uid"] = np.array(uids, dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", self.trainer.global_steps)
        return batch

    # -- separate_async: the next step's first round, generated while this step trains; verl's GPU switch ------

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        """How many of step ``global_steps``'s ``train_batch_size`` groups need no more generation; never waits.

        verl's ``separate_async`` trainer with ``hybrid_rollout.enable_switch=true`` reads this to decide whether
        to lend its GPUs to generation: at the end of step k for step k+1, and at the start of a step and of each
        slice for that step. It lends while the count is below its switch threshold (a share of
        ``data.train_batch_size``, at least one slice). The answer:

        * the step's batch is already built: its groups not served yet;
        * otherwise: carried groups still fresh at that step (``max_staleness_steps``) plus the informative groups
          of the prefetched round that TransferQueue already holds as finished, at most ``train_batch_size``.
          Groups still generating count nothing (lending GPUs is what finishes them sooner), and neither do
          finished all-correct or all-wrong ones (the step would drop them).

        The batch is built whole before its first slice is served, so a count below ``train_batch_size`` means
        the step will wait for generation even when it reaches verl's threshold.
        """
        if partition_id != "train":
            return super().get_sampleable_count(global_steps, partition_id)
        if self._served_step == global_steps:
            return len(self._step_groups)
        if self._replenisher is None:  # nothing submitted yet: the first step builds its batch from scratch
            return 0
        usable = self._replenisher.fresh_carried(global_steps)
        return min(usable + self._finished_informative(), self.dapo.sampler.train_batch_size)

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int) -> tuple[set[str], dict]:
        """Build step ``global_steps``'s batch now (``sample`` then serves it); return its prompt uids and ``{}``.

        verl calls it while its GPUs are lent to generation and takes them back when it returns. verl's own
        buffer returns once ``target_count`` groups are sampleable; this one returns once the whole batch is built
        (``train_batch_size`` groups, which verl's threshold never exceeds; fewer only with
        ``on_shortfall=partial``), because no slice can be served before that: the lent GPUs keep generating for
        as long as the step needs generation. The sampler's metrics come with the first slice, not here.
        """
        if partition_id != "train":
            return super().wait_for_sampleable(global_steps, partition_id, target_count)
        self._prepare(global_steps)
        return {g.payload.uid for g in self._step_groups}, {}

    def _prefetched_round(self) -> tuple[tuple[int, ...], list[str]] | None:
        """(prompt ids, prompt keys) of the round generating for the next step, or None.

        A resumed run holds the checkpoint's keys until its first ``sample()`` reconciles them; the restored plan
        is the same round (:meth:`_resume_inflight` pairs them the same way).
        """
        if self._inflight is not None:
            return self._inflight
        if self._restored_inflight and self._replenisher is not None:
            planned = self._replenisher.plan_next_round()  # the restored plan; calling it again returns the same
            if len(planned) == len(self._restored_inflight):
                return tuple(planned), self._restored_inflight
        return None

    def _finished_informative(self) -> int:
        """Informative groups of the prefetched round that TransferQueue holds as finished (read without waiting).

        A group's verdict is read once and kept while its round is in flight: a finished group does not change.
        """
        prefetched = self._prefetched_round()
        if prefetched is None:
            self._verdicts = {}
            return 0
        prompt_ids, uids = prefetched
        current = set(uids)
        self._verdicts = {uid: v for uid, v in self._verdicts.items() if uid in current}
        listing = train_listing()
        unread = [
            (p, u)
            for p, u in zip(prompt_ids, uids)
            if u not in self._verdicts and listing.get(u, {}).get("status") == "finished"
        ]
        if unread:
            assert self._replenisher is not None
            groups = read_round(
                [p for p, _ in unread],
                [u for _, u in unread],
                listing,
                metric=self._replenisher.config.metric,
                response_length=int(self.trainer.config.actor_rollout_ref.rollout.response_length),
            )
            for (_, uid), group in zip(unread, groups):
                self._verdicts[uid] = is_kept(group, filtering=self._replenisher.config.enable)
        return sum(self._verdicts.values())

    def _take_inflight(self, prompt_ids: Sequence[int]) -> list[str] | None:
        """The prompt keys of the prefetched round if ``prompt_ids`` is it (the replenisher generates its plan
        first), else None."""
        if self._inflight is None:
            return None
        planned, uids = self._inflight
        if tuple(prompt_ids) != planned:
            raise RuntimeError(
                f"The sampler generated prompts {list(prompt_ids)[:8]}... before its planned round "
                f"{list(planned)[:8]}..., which is already generating. This is a dapo_verl bug."
            )
        self._inflight = None
        return uids

    def _resume_inflight(self, uids: list[str]) -> None:
        """Follow the prefetched round saved with the checkpoint (its prompt keys ``uids``).

        verl checkpoints TransferQueue in async modes and re-issues the prompts still generating, so the round is
        normally there to wait for; one that TransferQueue did not keep is submitted again.
        """
        assert self._replenisher is not None
        if not uids:
            return
        planned = self._replenisher.plan_next_round()  # the restored plan, not a new one
        listing = train_listing()
        if len(uids) == len(planned) and all(uid in listing for uid in uids):
            self._inflight = (tuple(planned), uids)
            return
        self._clear([uid for uid in uids if uid in listing])
        if planned:
            self._inflight = (tuple(planned), self._submit(planned))

    # -- checkpoints ----------------------------------------------------------------------------------------

    def save_state(self, checkpoint_dir: str) -> None:
        """Write the replenisher's state into verl's checkpoint folder (called by the checkpoint callback)."""
        if self._replenisher is not None:
            state = self._replenisher.state_dict()
            state["v1_inflight_uids"] = list(self._inflight[1]) if self._inflight else []
            save_state(state, os.path.join(checkpoint_dir, SAMPLER_STATE_FILE))

    def _restoring_after(self, load_checkpoint: Any) -> Any:
        """Wrap verl's ``_load_checkpoint`` so that a resume restores the sampler right after it.

        verl's ``fit()`` computes the epoch it starts in (and whether its loop runs at all) as ``global_steps //
        steps_per_epoch`` before the first ``sample()`` (v1 ``trainer_base.py``: ``fit``); the restored data epoch
        must have set that divisor by then (:meth:`_follow_data_epochs`).
        """

        def load_then_restore(*args: Any, **kwargs: Any) -> Any:
            result = load_checkpoint(*args, **kwargs)
            if self.trainer.global_steps > 0:
                self._ensure_replenisher(self.trainer.global_steps + 1)
            return result

        return load_then_restore

    def _restore(self, global_steps: int) -> None:
        """Load the state saved at step ``global_steps - 1``; TransferQueue is reconciled by the next ``_prepare``."""
        folder = _resume_folder(self.trainer.config, global_steps - 1)
        path = os.path.join(folder, SAMPLER_STATE_FILE)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"Resuming at step {global_steps} from {folder}, which has no {SAMPLER_STATE_FILE}: it was not written "
                f"by dapo_verl's sampler, so carried groups and prompt history cannot be restored. Resume from a "
                f"dapo_verl checkpoint or set trainer.resume_mode=disable."
            )
        assert self._replenisher is not None
        state = load_state(path)
        self._replenisher.load_state_dict(state)
        self._restored_inflight = [str(uid) for uid in state.get("v1_inflight_uids", [])]
        self._follow_data_epochs(global_steps - 1)
        logger.info("dapo_verl: restored the sampler state from %s", path)

    def _clear_orphans(self, keep: Collection[str] = ()) -> None:
        """Drop trajectories a restored TransferQueue holds for groups the sampler no longer tracks (``keep``:
        prompt keys of the prefetched round, which it does).

        verl saves TransferQueue before it clears the step's trained trajectories, so an async checkpoint holds
        them without their prompt keys.
        """
        listing = train_listing()
        tracked = {*self._live_uids(), *keep}
        orphans = [key for key in listing if key.split("_")[0] not in tracked]
        if orphans:
            tq.kv_clear(partition_id="train", keys=orphans)


def _no_submission(*args: Any) -> None:
    """Replaces the v1 trainer's own prompt submissions (the replenisher submits its rounds itself)."""


def _resume_folder(config: Any, step: int) -> str:
    """The ``global_step_<step>`` folder verl resumed from (``resume_mode`` auto or resume_path)."""
    if config.trainer.resume_mode == "resume_path" and config.trainer.resume_from_path:
        return os.path.abspath(str(config.trainer.resume_from_path))
    return os.path.join(os.path.abspath(str(config.trainer.default_local_dir)), f"global_step_{step}")


class DapoCheckpointCallback(CheckpointCallback):
    """``trainer.checkpoint_callback_class``: saves :class:`DapoReplayBuffer`'s state with each checkpoint."""

    def on_save(
        self, trainer: Any, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs: Any
    ) -> None:
        buffer = getattr(trainer, "replay_buffer", None)
        if isinstance(buffer, DapoReplayBuffer):
            buffer.save_state(checkpoint_dir)
