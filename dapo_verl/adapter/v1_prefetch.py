"""``separate_async`` in :class:`~dapo_verl.adapter.v1_sampler.DapoReplayBuffer`: the next step's first round,
generated while this step trains, and the answers verl's GPU switch asks for.

In ``separate_async`` the rollout replicas are a pool of their own that keeps generating while the trainer trains, so
at the end of each step's sampling the buffer submits the next step's first round
(:meth:`~dapo_verl.sampler.BatchReplenisher.plan_next_round`); the next ``sample()`` takes its prompt keys
(:meth:`PrefetchedRound._take_inflight`), a resume reconciles the keys saved with the checkpoint
(:meth:`PrefetchedRound._resume_inflight`), and with ``hybrid_rollout.enable_switch=true`` verl asks how much of a
step needs no more generation (:meth:`PrefetchedRound.get_sampleable_count`) and waits for the batch while its GPUs
are lent (:meth:`PrefetchedRound.wait_for_sampleable`). A mixin of the buffer: it reads and sets the buffer's state.
"""

from __future__ import annotations

from collections.abc import Sequence

from dapo_verl.adapter.v1_groups import read_round, train_listing
from dapo_verl.sampler.carry import fresh
from dapo_verl.sampler.verdicts import is_kept

__all__ = ["PrefetchedRound"]


class PrefetchedRound:
    """The buffer's ``separate_async`` round and switch answers (module docstring); mixed into the buffer first."""

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
        staleness = self.dapo.sampler.max_staleness_steps
        usable = sum(fresh(born, global_steps, staleness) for born, _ in self._replenisher.carried)
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
