"""DapoReplayBuffer's answers to separate_async's GPU switch, fed to verl 0.9.1's own switch code.

verl's ``PPOTrainerSeparateAsync`` (``verl/trainer/ppo/v1/trainer_separate_async.py``) lends the trainer's GPUs to
generation after a step whose next batch is short (``on_step_end``: ``get_sampleable_count(global_steps + 1)``
against its switch threshold, SEP:344-358), and takes them back at the start of the next step once the buffer has
enough (``on_step_begin``, SEP:250-253) or after ``wait_for_sampleable`` (``prepare_step``, SEP:278-288). Here those
methods are verl's own, unchanged, on a verl v1 trainer without workers (``tools/verl_fakes/v1_trainer.py``) over a real
TransferQueue and verl's agent-loop code (``tools/verl_fakes/v1_rollout.py``, virtual timing: generation advances only
while a buffer polls or a simulated training step runs, so every answer is deterministic). What a CPU test cannot
have is replaced, and only that: verl's ``__init__``/``_setup`` (they start workers, rollout servers and the
global load balancer) by the attributes ``_init_hybrid_rollout_state`` and ``_setup`` set, the checkpoint-engine
managers by recorders, and the load balancer's add/remove/clear by recorders. The expected counts come from the
simulated policy's own draws, not from TransferQueue read the way the buffer reads it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytestmark = [pytest.mark.verl, pytest.mark.slow]

tq = pytest.importorskip("transfer_queue")

from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode, PPOTrainerSeparateAsync  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from dapo_verl.adapter.v1_sampler import DapoReplayBuffer  # noqa: E402
from tests.integration.test_v1_sampler_tq import CARRY, MIXED, TBS, N, transfer_queue  # noqa: E402, F401
from tools.verl_fakes.v1_rollout import SimulatedRollout, clear_all, train_keys  # noqa: E402
from tools.verl_fakes.v1_trainer import SimulatedTrainer, StepRecord, compose_v1_config  # noqa: E402

STEP_TIMEOUT_S = 120.0
STEPS = 6
SWITCH = [
    "trainer.v1.separate_async.hybrid_rollout.enable_switch=true",
    "trainer.v1.separate_async.parameter_sync_step=1",
    f"actor_rollout_ref.actor.ppo_mini_batch_size={TBS}",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "trainer.n_gpus_per_node=1",
    f"trainer.total_training_steps={STEPS}",
    *CARRY,
]
DECISION = "separate_async/decision/"


class _Recorder:
    """Stands in for a checkpoint-engine manager: records the calls verl's switch makes on it."""

    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def __getattr__(self, method: str) -> Callable[..., dict]:
        def record(*args: Any, **kwargs: Any) -> dict:
            self.calls.append(f"{self.name}.{method}")
            return {}

        return record


class SwitchingTrainer(SimulatedTrainer, PPOTrainerSeparateAsync):
    """verl's separate_async trainer (its switch hooks, ``prepare_step`` and ``on_step_end``) without workers.

    Method resolution takes ``on_step_begin``, ``prepare_step``, ``on_sample_begin``, ``_switch_threshold``,
    ``switch_to_rollout``/``switch_to_trainer`` and the rest of the switch from ``PPOTrainerSeparateAsync``;
    ``SimulatedTrainer``'s no-op ``on_sample_end``/``on_step_end`` are routed back to verl's.
    """

    def __init__(self, config: Any, rollout: SimulatedRollout, **kwargs: Any) -> None:
        super().__init__(config, rollout, **kwargs)
        self.calls: list[str] = []
        self.waits: list[tuple[int, int, set[str]]] = []  # (step, verl's target, uids the buffer returned)
        self._enable_hybrid_replicas = True
        self.hybrid_rollout_config = omega_conf_to_dataclass(config.trainer.v1.separate_async.hybrid_rollout)
        self._init_hybrid_rollout_state()  # SEP:112
        self.current_mode = HybridEngineMode.ROLLOUT  # SEP:172-175: hybrid replicas generate after start-up
        self.prev_step_profile = False
        self.checkpoint_manager = _Recorder(self.calls, "hybrid")
        self.standalone_checkpoint_manager = _Recorder(self.calls, "standalone")
        wait = self.replay_buffer.wait_for_sampleable

        def recorded_wait(global_steps: int, partition_id: str, target_count: int) -> tuple[set[str], dict]:
            uids, metrics = wait(global_steps, partition_id, target_count)
            self.waits.append((global_steps, target_count, set(uids)))
            return uids, metrics

        self.replay_buffer.wait_for_sampleable = recorded_wait

    def add_replicas_to_balancer(self) -> None:
        self.calls.append("balancer.add")

    def remove_replicas_from_balancer(self) -> None:
        self.calls.append("balancer.remove")

    def clear_sticky_cache(self) -> dict:
        return {}

    def on_sample_end(self) -> None:
        PPOTrainerSeparateAsync.on_sample_end(self)

    def on_step_end(self) -> None:
        PPOTrainerSeparateAsync.on_step_end(self)

    def train_step(self) -> StepRecord:
        self.timing_raw = {}  # fit() resets it every step (TB:470)
        self.mode_at_begin = self.current_mode
        return super().train_step()


@pytest.fixture
def make_switching(transfer_queue, tmp_path) -> Iterator[Callable[..., SwitchingTrainer]]:  # noqa: F811
    clear_all()
    rollouts: list[SimulatedRollout] = []

    def make(
        *overrides: str, train_budgets: float = 0.0, resume: bool = False, folder: str = "ckpt", begin: bool = True
    ) -> SwitchingTrainer:
        config = compose_v1_config(
            tmp_path / folder,
            f"data.train_batch_size={TBS}",
            f"actor_rollout_ref.rollout.n={N}",
            *SWITCH,
            *overrides,
            mode="separate_async",
        )
        rollout = SimulatedRollout(config, MIXED, seed=0, timing="virtual")
        rollouts.append(rollout)
        trainer = SwitchingTrainer(config, rollout, dataset_size=64, resume=resume, train_budgets=train_budgets)
        if begin:
            trainer.begin()
        return trainer

    yield make
    for rollout in rollouts:
        rollout.wait_idle()
        rollout.close()
    clear_all()


def _step(trainer: SwitchingTrainer) -> StepRecord:
    """One of fit()'s iterations under a timeout (a sample() that never returns fails the test)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool, trainer.rollout.virtual_time():
        return pool.submit(trainer.train_step).result(timeout=STEP_TIMEOUT_S)


def _buffer(trainer: SwitchingTrainer) -> DapoReplayBuffer:
    buffer = trainer.replay_buffer
    assert isinstance(buffer, DapoReplayBuffer) and buffer._replenisher is not None
    return buffer


def _expected_ready(trainer: SwitchingTrainer, step: int, rollout: SimulatedRollout | None = None) -> dict[str, int]:
    """What is ready for ``step`` by the simulated policy's draws: fresh carried groups and the prefetched round's
    finished informative / uninformative groups and unfinished ones."""
    buffer = _buffer(trainer)
    replenisher = buffer._replenisher
    groups = (rollout or trainer.rollout).groups
    staleness = replenisher.config.max_staleness_steps
    counts = {"fresh": 0, "stale": 0, "informative": 0, "uninformative": 0, "unfinished": 0}
    for born, _ in replenisher.carried:
        counts["fresh" if step - born <= staleness else "stale"] += 1
    uids = buffer._inflight[1] if buffer._inflight else (buffer._restored_inflight or [])
    listing = train_keys()
    for uid in uids:
        if listing.get(uid, {}).get("status") != "finished":
            counts["unfinished"] += 1
        else:
            correct = sum(groups[uid].correct)
            counts["informative" if 0 < correct < N else "uninformative"] += 1
    counts["ready"] = min(counts["fresh"] + counts["informative"], TBS)
    return counts


@pytest.mark.parametrize("train_budgets", [0.0, 2.0])
def test_verls_switch_lends_the_gpus_only_for_a_step_the_prefetched_round_has_not_filled(make_switching, train_budgets):
    # train_budgets: generation time one training step lasts. 0: the next step's round has not started when verl
    # decides. 2.0: every group takes at most 1, so the round has finished and usually fills the next batch.
    trainer = make_switching(train_budgets=train_budgets)
    buffer = trainer.replay_buffer
    assert buffer.get_sampleable_count(1, "train") == 0  # nothing is generating before the first step
    threshold = trainer._switch_threshold()
    assert threshold == TBS  # one slice per step: verl's threshold is the whole batch (SEP:290-295)
    lent, kept = [], []
    for step in range(1, STEPS + 1):
        record = _step(trainer)
        if (step - 1) in lent or step == 1:  # the GPUs generated for this step (verl starts in rollout mode)
            assert trainer.mode_at_begin == HybridEngineMode.ROLLOUT
            ((_, target, uids),) = [w for w in trainer.waits if w[0] == step]
            assert target == threshold and uids == set(record.groups) and len(uids) == TBS
        else:
            assert trainer.mode_at_begin == HybridEngineMode.TRAINER
            assert all(w[0] != step for w in trainer.waits)
        decision = trainer._pending_sync_metrics
        expected = _expected_ready(trainer, step + 1)
        assert (
            decision[DECISION + "sampleable_count"]
            == expected["ready"]
            == buffer.get_sampleable_count(step + 1, "train")
        )
        assert decision[DECISION + "remaining"] == threshold - expected["ready"]
        should = bool(decision[DECISION + "should_switch_to_rollout"])
        if step < STEPS:
            assert should == (expected["ready"] < threshold)  # a stub's switch costs ~0: any shortfall pays
            (lent if should else kept).append(step)
        else:
            assert not should  # verl never lends after the last step
        assert trainer.current_mode == (HybridEngineMode.ROLLOUT if should else HybridEngineMode.TRAINER)
        trainer._consume_sync_metrics()
    if train_budgets == 0.0:  # the round had not started: every step short of carried groups was lent
        assert lent
    else:  # the round finished during training: verl kept its GPUs where it filled the next batch
        assert kept
    assert _buffer(trainer)._replenisher.conservation_gap() == 0


def test_the_count_adds_fresh_carried_and_finished_informative_groups_of_the_round_without_waiting(make_switching):
    trainer = make_switching(
        "algorithm.filter_groups.refill=barrier",
        f"data.gen_batch_size={6 * TBS}",
        "algorithm.filter_groups.max_staleness_steps=1",
    )
    buffer = trainer.replay_buffer
    seen = {"stale": 0, "uninformative": 0, "unfinished": 0, "partial": 0}
    for step in range(1, STEPS):
        _step(trainer)
        assert buffer._inflight is not None or _expected_ready(trainer, step + 1)["fresh"] >= TBS
        while True:  # the round generates in virtual time; every poll reads TransferQueue without waiting
            expected = _expected_ready(trainer, step + 1)
            assert buffer.get_sampleable_count(step + 1, "train") == expected["ready"]
            for kind in ("stale", "uninformative", "unfinished"):
                seen[kind] += expected[kind] > 0
            if not expected["unfinished"]:
                break
            seen["partial"] += expected["informative"] > 0
            trainer.rollout.advance(0.25)
        trainer.rollout.advance(1.0)  # the rest of the round: its groups take at most 1 budget
    assert all(seen.values()), seen  # each kind of group the count must leave out occurred


def test_a_resumed_run_counts_the_round_finished_before_its_checkpoint(make_switching):
    run = ["trainer.save_freq=2", "trainer.resume_mode=auto"]
    first = make_switching(*run, train_budgets=2.0, folder="resumed")
    _step(first)
    _step(first)
    expected = _expected_ready(first, 3)
    assert not expected["unfinished"] and expected["ready"] > 0
    first.rollout.wait_idle()
    clear_all()  # a new process: TransferQueue comes back from verl's checkpoint

    resumed = make_switching(*run, train_budgets=2.0, folder="resumed", resume=True)
    buffer = _buffer(resumed)
    assert buffer._inflight is None and buffer._restored_inflight  # not reconciled before the first sample()
    assert (
        buffer.get_sampleable_count(3, "train")
        == expected["ready"]
        == _expected_ready(resumed, 3, first.rollout)["ready"]
    )
    record = _step(resumed)
    assert resumed.mode_at_begin == HybridEngineMode.ROLLOUT  # after start-up, as verl's _setup leaves it
    assert bool([w for w in resumed.waits if w[0] == 3]) == (expected["ready"] < TBS)
    assert len(record.groups) == TBS
