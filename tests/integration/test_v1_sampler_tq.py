"""DapoReplayBuffer against a real TransferQueue, driven the way verl 0.9.1's v1 trainer and agent loop drive it.

As in verl's own ``tests/trainer/ppo/v1/test_replay_buffer_on_cpu.py``, a CPU-only TransferQueue (TQ) runs for
the module and a producer fills it while the buffer's blocking ``sample()`` polls. Here the producer is verl's
own agent-loop worker code on an event loop in a background thread (``tools/verl_fakes/v1_rollout.py``): each
submitted prompt goes ``pending`` (written by verl's ``_submit_batch_to_rollout``) -> ``running`` -> its n
trajectories ``{uid}_{session}_0`` with verl's tags -> ``finished``, and only the correctness draw is
simulated (a seeded per-prompt pass rate). The trainer around the buffer is a verl ``PPOTrainer`` built without
workers (``tools/verl_fakes/v1_trainer.py``): verl's ``_build_replay_buffer``, ``_init_dataloader``, ``step()``,
``_save_checkpoint`` and ``_load_checkpoint`` run as they are, and ``_step_once`` only samples.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Iterator

import pytest

pytestmark = [pytest.mark.verl, pytest.mark.slow]

ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")

from dapo_verl.adapter.v1_sampler import SAMPLER_STATE_FILE, DapoReplayBuffer  # noqa: E402
from dapo_verl.sampler import ShortfallError  # noqa: E402
from dapo_verl.sampler.engine import Request  # noqa: E402
from dapo_verl.sampler.simulation import drifting_pass_rates  # noqa: E402
from dapo_verl.state_io import load_state  # noqa: E402
from tools.verl_fakes.v1_rollout import SimulatedRollout, clear_all, train_keys  # noqa: E402
from tools.verl_fakes.v1_trainer import SimulatedTrainer, StepRecord, compose_v1_config  # noqa: E402

N = 4  # responses per prompt (actor_rollout_ref.rollout.n)
TBS = 4  # data.train_batch_size
STEP_TIMEOUT_S = 120.0  # a blocked sample() fails the test instead of hanging it
MIXED = drifting_pass_rates(64, seed=3, start_logit_mean=0.0, start_logit_std=2.0, drift_per_step=0.0)
CARRY = ["algorithm.filter_groups.surplus=carry"]
# ~3x what a step needs, from prompts chosen without prediction: at this scenario's ~50% keep rate the surplus piles up
# and goes stale (ranked by prediction, nearly every group of the 64-prompt pool is informative and little is left over)
SURPLUS = [
    "algorithm.filter_groups.refill=barrier",
    f"data.gen_batch_size={3 * TBS}",
    *CARRY,
    "algorithm.filter_groups.prompt_selection=streak",
]
VERL_BUFFER = ["trainer.v1.sampler.custom_sampler.path=null", "trainer.v1.sampler.custom_sampler.name=null"]


@pytest.fixture(scope="module")
def transfer_queue() -> Iterator[None]:
    """Ray with 8 logical CPUs (TQ's two actors take 2; a 2-core machine would leave none), then TQ."""
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=8, include_dashboard=False)
    tq.init()
    yield
    tq.close()
    if started_ray:
        ray.shutdown()


@pytest.fixture
def make_trainer(transfer_queue, tmp_path) -> Iterator[Callable[..., SimulatedTrainer]]:
    """Builds simulated v1 trainers (fresh config each, as a new process composes it); cleans TQ afterwards."""
    clear_all()
    rollouts: list[SimulatedRollout] = []

    def make(
        *overrides: str,
        mode: str = "sync",
        pass_rate=MIXED,
        resume: bool = False,
        folder: str = "ckpt",
        begin: bool = True,
        **rollout_kwargs,
    ) -> SimulatedTrainer:
        config = compose_v1_config(
            tmp_path / folder, f"data.train_batch_size={TBS}", f"actor_rollout_ref.rollout.n={N}", *overrides, mode=mode
        )
        rollout = SimulatedRollout(config, pass_rate, seed=0, **rollout_kwargs)
        rollouts.append(rollout)
        trainer = SimulatedTrainer(config, rollout, dataset_size=64, resume=resume)
        if begin:
            trainer.begin()
        return trainer

    yield make
    for rollout in rollouts:
        rollout.wait_idle()
        rollout.close()
    clear_all()


def _steps(trainer: SimulatedTrainer, count: int) -> list[StepRecord]:
    """Run ``count`` training steps, each under a timeout (a sample() that never returns fails the test)."""
    records = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        for _ in range(count):
            records.append(pool.submit(trainer.train_step).result(timeout=STEP_TIMEOUT_S))
    return records


def _replenisher(trainer: SimulatedTrainer):
    buffer = trainer.replay_buffer
    assert isinstance(buffer, DapoReplayBuffer)
    assert buffer._replenisher is not None
    return buffer._replenisher


def _uid(key: str) -> str:
    return key.split("_")[0]


def _served(records: list[StepRecord]) -> list[list[tuple[int, list[float]]]]:
    """What each step trained, independent of uids: (prompt index, accs) per group, in batch order."""
    return [list(record.groups.values()) for record in records]


def _assert_tq_holds_only_carried_groups(trainer: SimulatedTrainer) -> None:
    carried = {group.payload.uid: group.payload for _, group in _replenisher(trainer).carried}
    listing = train_keys()
    assert {_uid(key) for key in listing} == set(carried)
    for uid, payload in carried.items():
        assert listing[uid]["status"] == "finished"
        assert sorted(k for k in listing if k != uid and _uid(k) == uid) == sorted(payload.keys)


# --------------------------------------------------------------------------- #
# The fake is as strict as verl.
# --------------------------------------------------------------------------- #


def test_simulated_agent_loop_writes_verls_keys_tags_and_status_order(make_trainer):
    trainer = make_trainer(*VERL_BUFFER, timing="virtual")
    rollout = trainer.rollout
    trainer._add_prompts_to_generate(2)  # verl's own refill path: dataloader -> _submit_batch_to_rollout
    uids = list(rollout.groups)
    listing = train_keys()
    # verl's pending tag, then the worker's {status: running} merged into it; no trajectory before completion
    assert listing == {uid: {"is_prompt": True, "status": "running", "global_steps": 1} for uid in uids}
    while any(train_keys()[uid]["status"] != "finished" for uid in uids):
        rollout.sleep()
    listing = train_keys()
    for uid in uids:
        keys = sorted(k for k in listing if _uid(k) == uid and k != uid)
        assert keys == [f"{uid}_{session}_0" for session in range(N)]
        for key in keys:
            tag = listing[key]
            assert set(tag) == {
                "status",
                "prompt_len",
                "response_len",
                "seq_len",
                "global_steps",
                "min_global_steps",
                "max_global_steps",
            }
            assert tag["status"] == "success" and tag["seq_len"] == tag["prompt_len"] + tag["response_len"]
            assert tag["global_steps"] == tag["min_global_steps"] == tag["max_global_steps"] == 1
        values = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["extra_fields", "rm_scores", "index"])
        group = rollout.groups[uid]
        accs = [getattr(e, "data", e)["reward_extra_info"]["acc"] for e in values["extra_fields"]]
        assert accs == [float(c) for c in group.correct]
        assert [float(r.sum()) for r in values["rm_scores"]] == [1.0 if c else -1.0 for c in group.correct]
        assert list(values["index"]) == [group.index] * N


def test_batched_writer_writes_what_verls_agent_loop_writes(make_trainer):
    written = {}
    for writer in ("verl", "batched"):
        trainer = make_trainer(*VERL_BUFFER, timing="virtual", writer=writer)
        trainer._add_prompts_to_generate(3)
        rollout = trainer.rollout
        while any(g.completion_seq is None for g in rollout.groups.values()):
            rollout.sleep()
        listing = train_keys()
        written[writer] = {
            (rollout.groups[_uid(key)].index, key[len(_uid(key)) :]): tag for key, tag in listing.items()
        }
        clear_all()
    assert written["verl"] == written["batched"]


# --------------------------------------------------------------------------- #
# Exact batches, slices, conservation, cleanup.
# --------------------------------------------------------------------------- #


def test_every_step_serves_exactly_train_batch_size_complete_informative_groups(make_trainer):
    trainer = make_trainer()
    for record in _steps(trainer, 4):
        assert len(record.slices) == 1
        assert len(record.groups) == TBS and len(record.keys) == TBS * N
        for uid, (_, accs) in record.groups.items():
            assert sorted(k for k in record.keys if _uid(k) == uid) == [f"{uid}_{s}_0" for s in range(N)]
            assert 0.0 < sum(accs) < N  # informative: neither all correct nor all wrong
        batch, metrics = record.slices[0]
        assert all({"seq_len", "min_global_steps", "max_global_steps"} <= set(tag) for tag in batch.tags)
        assert metrics["dapo/sampler/groups_trained"] == TBS
        assert record.metrics["dapo/sampler/groups_trained"] == TBS  # as verl's MetricsAggregator reduces it
    assert _replenisher(trainer).conservation_gap() == 0


def test_parameter_sync_step_slices_one_step_and_reports_its_counters_once(make_trainer):
    trainer = make_trainer(
        "trainer.v1.separate_async.parameter_sync_step=2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={TBS // 2}",
        *CARRY,
        mode="separate_async",
    )
    buffer = trainer.replay_buffer
    for step in (1, 2, 3):
        ready = buffer.get_sampleable_count(step, "train")  # carried and prefetched groups (test_v1_switch.py)
        assert ready == 0 if step == 1 else 0 <= ready <= TBS
        uids, _ = buffer.wait_for_sampleable(step, "train", TBS // 2)  # separate_async's hybrid-switch wait
        assert len(uids) == TBS and buffer.get_sampleable_count(step, "train") == TBS
        record = _steps(trainer, 1)[0]
        assert [len({_uid(k) for k in batch.keys}) for batch, _ in record.slices] == [TBS // 2, TBS // 2]
        assert set(record.groups) == uids
        first, second = (metrics for _, metrics in record.slices)
        assert first["dapo/sampler/groups_trained"] == TBS
        assert not any(k.startswith("dapo/sampler/") for k in second)
        for key, value in first.items():  # verl's MetricsAggregator keeps the counters whole
            if key.startswith("dapo/sampler/"):
                assert record.metrics[key] == value, key
        assert buffer.get_sampleable_count(step, "train") == 0
    assert _replenisher(trainer).conservation_gap() == 0


def test_every_generated_group_is_trained_carried_or_dropped_and_dropped_ones_leave_tq(make_trainer):
    trainer = make_trainer(*SURPLUS)
    records = _steps(trainer, 5)
    replenisher = _replenisher(trainer)
    assert replenisher.conservation_gap() == 0
    generated = set(trainer.rollout.groups)
    trained = {uid for record in records for uid in record.groups}
    carried = {group.payload.uid for _, group in replenisher.carried}
    dropped = generated - trained - carried
    assert not trained & carried
    assert replenisher.counters["groups_generated"] == len(generated)
    assert replenisher.counters["groups_trained"] == len(trained) == 5 * TBS
    assert len(dropped) == sum(replenisher.dropped.values()) > 0
    assert replenisher.dropped["surplus"] + replenisher.dropped["stale"] > 0  # surplus really happened
    assert not {_uid(k) for k in train_keys()} & dropped
    _assert_tq_holds_only_carried_groups(trainer)


def test_rounds_keep_the_recipes_gen_batch_size_although_verl_forces_it_to_one(make_trainer):
    trainer = make_trainer("algorithm.filter_groups.refill=barrier", "data.gen_batch_size=6")
    assert trainer.config.data.gen_batch_size == 1  # verl's _init_dataloader, after the buffer was built
    _steps(trainer, 2)
    assert trainer.rollout.dispatches and set(trainer.rollout.dispatches) == {6}


# --------------------------------------------------------------------------- #
# Checkpoint / resume.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("selection", ["streak", "predicted"])
@pytest.mark.parametrize("mode", ["sync", "colocate_async"])
def test_resumed_run_serves_what_an_uninterrupted_run_serves(make_trainer, tmp_path, mode, selection):
    # Predicted: the predictor's beliefs, prior, calibration and noted predictions are part of the saved state.
    run = [
        *SURPLUS[:-1],
        f"algorithm.filter_groups.prompt_selection={selection}",
        "trainer.save_freq=2",
        "trainer.total_training_steps=4",
        "trainer.resume_mode=auto",
    ]
    whole = make_trainer(*run, mode=mode, folder="whole")
    uninterrupted = _steps(whole, 4)
    expected_counters = dict(_replenisher(whole).counters), dict(_replenisher(whole).dropped)
    whole.rollout.wait_idle()
    clear_all()

    first = make_trainer(*run, mode=mode, folder="resumed")
    head = _steps(first, 2)
    assert _served(head) == _served(uninterrupted[:2])
    assert os.path.exists(tmp_path / "resumed" / "global_step_2" / SAMPLER_STATE_FILE)
    first.rollout.wait_idle()
    clear_all()  # the process ends: a new one starts with an empty TQ (async modes restore it from the checkpoint)

    resumed = make_trainer(*run, mode=mode, folder="resumed", resume=True)
    assert resumed.global_steps == 3
    tail = _steps(resumed, 2)
    assert _served(tail) == _served(uninterrupted[2:])
    replenisher = _replenisher(resumed)
    assert (dict(replenisher.counters), dict(replenisher.dropped)) == expected_counters
    assert replenisher.conservation_gap() == 0
    _assert_tq_holds_only_carried_groups(resumed)


def test_a_resume_restores_the_data_epoch_before_verls_fit_derives_its_epoch(make_trainer):
    # verl's fit() takes its first epoch as global_steps // steps_per_epoch before any sample() (TB:450) and runs
    # its loop only while that is below trainer.total_epochs (TB:467). Here a step reads more than the whole pool
    # (8 prompts of 64 per step at verl's count, far more by ranked selection), so by verl's own divisor the resumed
    # run would be past its only epoch and train nothing.
    run = [
        "data.train_batch_size=32",
        "algorithm.filter_groups.prompt_selection=predicted",
        "trainer.save_freq=2",
        "trainer.total_training_steps=4",
        "trainer.total_epochs=1",
        "trainer.resume_mode=auto",
    ]
    first = make_trainer(*run, folder="resumed")
    _steps(first, 2)
    saved_epoch = _replenisher(first).stream.epoch
    label = 2 // first.steps_per_epoch  # the uninterrupted run's label for step 3: (global_steps - 1) // divisor
    verl_divisor = len(first.train_dataset) // first.config.data.train_batch_size  # TB:765, before dapo_verl's
    assert saved_epoch >= 1 and 2 // verl_divisor >= 1  # the data wrapped; verl's divisor would end the loop
    first.rollout.wait_idle()
    clear_all()

    resumed = make_trainer(*run, folder="resumed", resume=True, begin=False)
    replenisher = _replenisher(resumed)  # restored by verl's _load_checkpoint, before any sample()
    assert replenisher.counters["train_steps"] == 2 and replenisher.stream.epoch == saved_epoch
    assert resumed.global_steps // resumed.steps_per_epoch == label >= 1  # fit()'s first epoch label
    assert label < resumed.config.trainer.total_epochs  # fit()'s loop runs
    resumed.begin()
    (record,) = _steps(resumed, 1)
    assert record.metrics["dapo/sampler/train_step"] == 3


def test_sync_checkpoint_steps_carry_nothing_because_verl_does_not_save_tq(make_trainer):
    trainer = make_trainer(*SURPLUS, "trainer.save_freq=2")
    records = _steps(trainer, 2)
    assert records[1].metrics["dapo/sampler/carried_groups"] == 0
    assert not train_keys()


# --------------------------------------------------------------------------- #
# Staleness and round bounds.
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_carried_groups_are_never_older_than_max_staleness_steps(make_trainer, max_staleness):
    trainer = make_trainer(
        "algorithm.filter_groups.refill=barrier",
        f"data.gen_batch_size={6 * TBS}",
        *CARRY,
        f"algorithm.filter_groups.max_staleness_steps={max_staleness}",
    )
    records = _steps(trainer, 5)
    ages = [
        record.step - tag["global_steps"] for record in records for batch, _ in record.slices for tag in batch.tags
    ]  # the trajectory tag's global_steps is the step it was submitted in
    assert max(ages) == max_staleness  # carried groups were trained up to the bound, never beyond
    assert _replenisher(trainer).dropped["stale"] > 0  # older ones were dropped
    _assert_tq_holds_only_carried_groups(trainer)


def _hopeless_except(every: int) -> Callable[[int, int], float]:
    """Prompts whose index is a multiple of ``every`` are solved half the time; all others never."""
    return lambda index, step: 0.5 if index % every == 0 else 0.0


def test_round_limit_with_on_shortfall_error_raises_the_samplers_error(make_trainer):
    trainer = make_trainer(
        "algorithm.filter_groups.max_num_gen_batches=2",
        "algorithm.filter_groups.on_shortfall=error",
        pass_rate=lambda index, step: 0.0,
    )
    with pytest.raises(ShortfallError, match="raise algorithm.filter_groups.max_num_gen_batches"):
        _steps(trainer, 1)
    assert 1 <= len(trainer.rollout.dispatches) <= 2  # never beyond the round limit


def test_round_limit_with_on_shortfall_partial_serves_the_groups_found(make_trainer):
    trainer = make_trainer(
        "algorithm.filter_groups.max_num_gen_batches=1",
        "algorithm.filter_groups.on_shortfall=partial",
        "algorithm.filter_groups.refill=barrier",
        f"data.gen_batch_size={TBS}",
        pass_rate=_hopeless_except(2),
    )
    records = _steps(trainer, 3)
    assert trainer.rollout.dispatches == [TBS] * 3  # one round per step
    for record in records:
        assert 0 < len(record.groups) < TBS
        assert len(record.keys) == len(record.groups) * N
        assert record.metrics["dapo/sampler/partial"] == 1.0
        assert all(index % 2 == 0 for index in record.prompts)
    replenisher = _replenisher(trainer)
    assert replenisher.conservation_gap() == 0 and not train_keys()


def test_partial_step_that_found_no_informative_group_fails_naming_the_knobs(make_trainer):
    trainer = make_trainer(
        "algorithm.filter_groups.max_num_gen_batches=1",
        "algorithm.filter_groups.on_shortfall=partial",
        pass_rate=lambda index, step: 0.0,
    )
    with pytest.raises(RuntimeError, match=r"found no informative group in .*max_num_gen_batches=1 rounds"):
        _steps(trainer, 1)
    assert _replenisher(trainer).conservation_gap() == 0
    assert not train_keys()  # the round's groups were dropped and cleared, not left behind


# --------------------------------------------------------------------------- #
# Validation and async modes.
# --------------------------------------------------------------------------- #


def test_validation_partition_passes_through_unfiltered_and_leaves_training_state_alone(make_trainer):
    trainer = make_trainer(
        *SURPLUS, "actor_rollout_ref.rollout.val_kwargs.n=2", pass_rate=lambda index, step: 1.0 if index % 2 else 0.5
    )
    _steps(trainer, 1)
    replenisher = _replenisher(trainer)
    state = dict(replenisher.counters), dict(replenisher.dropped), [g.payload.uid for _, g in replenisher.carried]
    train_before = train_keys()
    assert train_before  # carried groups wait in TQ meanwhile
    batch = trainer.validate()
    assert batch.partition_id == "val"
    val_uids = {uid for uid, group in trainer.rollout.groups.items() if len(group.correct) == 2}
    assert len(val_uids) == 8  # the whole validation batch, all-correct groups included
    assert sorted(batch.keys) == sorted(f"{uid}_{s}_0" for uid in val_uids for s in range(2))
    assert train_keys() == train_before
    assert (
        dict(replenisher.counters),
        dict(replenisher.dropped),
        [g.payload.uid for _, g in replenisher.carried],
    ) == state
    tq.kv_clear(keys=batch.keys, partition_id="val")  # as verl's _validate does after scoring
    assert not train_keys("val")
    _steps(trainer, 1)  # training continues from the same state
    assert replenisher.conservation_gap() == 0


SEPARATE = ["trainer.v1.separate_async.parameter_sync_step=1", f"actor_rollout_ref.actor.ppo_mini_batch_size={TBS}"]
NO_PREFETCH = ["+trainer.v1.sampler.sampler_kwargs.prefetch=false"]


@pytest.mark.parametrize("mode, extra", [("colocate_async", []), ("separate_async", NO_PREFETCH)])
def test_async_modes_serve_what_sync_serves_without_verls_warmup_batches(make_trainer, mode, extra):
    sync = _served(_steps(make_trainer(*SURPLUS, folder="sync"), 3))
    clear_all()
    trainer = make_trainer(*SURPLUS, *SEPARATE, *extra, mode=mode, folder=mode)
    assert not train_keys()  # verl's async warm-up batches are switched off: the replenisher submits every prompt
    assert trainer.replay_buffer.get_sampleable_count(1, "train") == 0
    assert _served(_steps(trainer, 3)) == sync
    replenisher = _replenisher(trainer)
    assert replenisher.counters["groups_generated"] == len(trainer.rollout.groups)
    assert replenisher.conservation_gap() == 0
    _assert_tq_holds_only_carried_groups(trainer)


def test_separate_async_generates_the_next_steps_first_round_while_this_step_trains(make_trainer):
    trainer = make_trainer(*CARRY, *SEPARATE, "trainer.total_training_steps=5", mode="separate_async")
    buffer, prefetched = trainer.replay_buffer, {}
    records = []
    for step in (1, 2, 3, 4):
        records += _steps(trainer, 1)
        if buffer._inflight is None:  # carried groups will fill the next batch: no round is needed
            assert _replenisher(trainer).plan_next_round() == []
            continue
        planned, uids = buffer._inflight  # submitted at the end of this step's sampling, before its training
        assert list(planned) == _replenisher(trainer).plan_next_round()
        listing = train_keys()
        assert all(listing[uid]["global_steps"] == step for uid in uids)  # verl's tag: the step it was submitted in
        prefetched[step] = set(uids)
    records += _steps(trainer, 1)
    assert buffer._inflight is None  # nothing is prefetched after the last step
    assert len(prefetched) >= 2
    for record in records[1:]:
        spans = {record.step - tag["global_steps"] + 1 for batch, _ in record.slices for tag in batch.tags}
        assert max(spans) <= 3  # 1, +1 for the prefetched round, +1 carried once more (max_staleness_steps=1)
        if record.step - 1 in prefetched:  # it trained groups of the round generated while the previous step trained
            trained_uids = {_uid(key) for batch, _ in record.slices for key in batch.keys}
            assert trained_uids & prefetched[record.step - 1] and 2 in spans
    replenisher = _replenisher(trainer)
    assert replenisher.counters["groups_generated"] == len(trainer.rollout.groups)
    assert replenisher.conservation_gap() == 0
    _assert_tq_holds_only_carried_groups(trainer)


def test_separate_async_resumes_waiting_for_the_round_generating_at_the_checkpoint(make_trainer, tmp_path):
    run = [*CARRY, *SEPARATE, "trainer.save_freq=2", "trainer.total_training_steps=4", "trainer.resume_mode=auto"]
    first = make_trainer(*run, mode="separate_async", folder="resumed")
    _steps(first, 2)
    assert first.replay_buffer._inflight is not None  # a round was generating when the checkpoint was taken
    planned, uids = first.replay_buffer._inflight
    first.rollout.wait_idle()
    generated_before = _replenisher(first).counters["groups_generated"]
    clear_all()  # a new process: TransferQueue comes back from verl's checkpoint

    resumed = make_trainer(*run, mode="separate_async", folder="resumed", resume=True)
    assert resumed.global_steps == 3
    _steps(resumed, 2)
    replenisher = _replenisher(resumed)
    # verl re-issued the checkpointed round under its prompt keys and the sampler waited for exactly those: every
    # group generated in the new process is one the sampler counted (none submitted twice, none lost).
    assert set(uids) <= set(resumed.rollout.groups)
    assert [resumed.rollout.groups[uid].index for uid in uids] == list(planned)
    assert replenisher.counters["groups_generated"] - generated_before == len(resumed.rollout.groups)
    assert replenisher.counters["train_steps"] == 4
    assert replenisher.conservation_gap() == 0
    _assert_tq_holds_only_carried_groups(resumed)


def test_a_span_above_verls_off_policy_threshold_is_refused_naming_the_knobs(make_trainer):
    with pytest.raises(ValueError, match=r"max_off_policy_threshold=2.*spanning 3 policy versions.*prefetch=false"):
        make_trainer(*SURPLUS, *SEPARATE, "trainer.v1.sampler.max_off_policy_threshold=2", mode="separate_async")


# --------------------------------------------------------------------------- #
# Streaming (algorithm.filter_groups.streaming=true). Thread timing with latencies of 1-2 s, so groups finish
# one by one and some are still generating when the batch fills; the simulated replicas park, abort and refuse to
# sleep while generating as verl's do (tools/verl_fakes/v1_rollout.py: SimulatedRollout.abort / replicas_sleep).
# --------------------------------------------------------------------------- #

STREAM = ["algorithm.filter_groups.streaming=true", "algorithm.filter_groups.stream_oversample=2.0"]
SLOW_GROUPS = {"latency_scale_s": 2.0}  # 1-2 s a group: far longer than a poll, even on a loaded machine


def _total(records: list[StepRecord], name: str) -> float:
    return sum(record.metrics[f"dapo/sampler/{name}"] for record in records)


def _assert_informative_full_batches(records: list[StepRecord]) -> None:
    for record in records:
        assert len(record.groups) == TBS
        assert all(0.0 < sum(accs) / len(accs) < 1.0 for _, accs in record.groups.values())


def _tracked_uids(trainer: SimulatedTrainer) -> set[str]:
    """Prompt keys the buffer answers for: carried groups of both kinds, those in flight, dropped ones still running."""
    buffer, replenisher = trainer.replay_buffer, _replenisher(trainer)
    assert buffer._engine is not None
    return (
        {g.payload.uid for _, g in replenisher.carried}
        | {p.payload.uid for _, p in replenisher.carried_aborted}
        | set(buffer._engine.inflight_uids)
        | buffer._abandoned
    )


def test_streaming_in_colocate_async_leaves_unfinished_groups_to_verl_and_follows_them_first(make_trainer):
    trainer = make_trainer(*STREAM, *CARRY, mode="colocate_async", **SLOW_GROUPS)
    records = []
    for _ in range(5):
        records += _steps(trainer, 1)
        assert {_uid(key) for key in train_keys()} <= _tracked_uids(trainer)  # nothing of ours leaks in TQ
    _assert_informative_full_batches(records)
    assert _total(records, "aborted_groups") > 0  # the batch filled with groups still generating ...
    assert _total(records, "resumed_groups") > 0  # ... which were followed at the next step, as verl continued them
    assert (
        max(
            record.step - tag["min_global_steps"]
            for record in records
            for batch, _ in record.slices
            for tag in batch.tags
        )
        <= 1
    )  # verl's own version tags: never older than max_staleness_steps (1)
    assert _replenisher(trainer).conservation_gap() == 0


def test_streaming_in_sync_aborts_what_the_batch_does_not_need_before_the_replicas_sleep(make_trainer):
    trainer = make_trainer(*STREAM, mode="sync", **SLOW_GROUPS)
    records = _steps(trainer, 4)  # on_sample_end's replicas_sleep raises if anything is still generating
    _assert_informative_full_batches(records)
    aborted = _total(records, "aborted_groups")
    assert aborted > 0 and _total(records, "resumed_groups") == 0
    assert _replenisher(trainer).ledger.dropped_aborted == {"stale": 0, "discarded": aborted}  # sync cannot resume
    assert _total(records, "aborted_tokens") > 0  # what the aborted requests held, counted
    assert not train_keys()  # aborted groups and surplus cleared from TQ
    assert _replenisher(trainer).conservation_gap() == 0


@pytest.mark.parametrize("reject", [True, False])
def test_a_sync_abort_right_after_a_submit_returns_although_requests_reach_the_closed_gate(make_trainer, reject):
    # verl's agent loop may still be sending a group's requests when the batch fills and the engine aborts; verl's
    # server parks a request that reaches its closed gate until the resume, and the sync engine resumes only once
    # every aborted group is published. Found on real vLLM: a sync streaming step waited forever. The engine aborts
    # with reject_request=True, so late arrivals return aborted with no tokens. The reject=False case shows the
    # fake parks as verl does: the same abort without rejection runs into the engine's bounded wait.
    trainer = make_trainer(*STREAM, mode="sync", **SLOW_GROUPS)
    engine = trainer.replay_buffer._streaming_engine()
    abort, resume = engine._abort_replicas
    engine._abort_replicas = (abort if reject else (lambda **_: abort()), resume)
    engine.abort_wait_s = 10.0
    engine.submit([Request(request_id=i, prompt_id=i, born_step=1) for i in range(TBS)])
    if not reject:
        with pytest.raises(TimeoutError, match=r"the aborted requests of a sync step .*stuck"):
            engine.abort()
        resume()  # the parked requests generate, so the fixture's wait for an idle rollout ends
        return
    aborted = engine.abort()
    # 1-2 s groups: none finished at once, and none had generated a token yet. verl's agent loop fails a session
    # whose response is empty (AgentLoopOutput.as_dict), so such a group ends "failure": discarded all the same.
    assert not aborted.finished and len(aborted.partial) == TBS
    assert all(partial.tokens == 0 for _, partial in aborted.partial)
    assert trainer.rollout.groups and all(group.aborted for group in trainer.rollout.groups.values())
    trainer.rollout.replicas_sleep()  # nothing is left generating


def test_streaming_checkpointed_steps_let_unfinished_groups_finish_and_a_resume_continues(make_trainer, tmp_path):
    # verl restarts a checkpointed in-flight prompt from scratch, so a checkpointed step leaves nothing in flight.
    run = [*STREAM, *CARRY, "trainer.save_freq=2", "trainer.total_training_steps=4", "trainer.resume_mode=auto"]
    first = make_trainer(*run, mode="colocate_async", folder="resumed", **SLOW_GROUPS)
    records = _steps(first, 2)
    assert records[1].metrics["dapo/sampler/carried_aborted_groups"] == 0
    assert not first.replay_buffer._engine.inflight_uids
    saved = load_state(str(tmp_path / "resumed" / "global_step_2" / SAMPLER_STATE_FILE))
    assert saved["carried_aborted"] == [] and saved["counters"]["aborted_groups"] == _total(records, "aborted_groups")
    first.rollout.wait_idle()
    clear_all()

    resumed = make_trainer(*run, mode="colocate_async", folder="resumed", resume=True, **SLOW_GROUPS)
    tail = _steps(resumed, 2)
    _assert_informative_full_batches(tail)
    assert [record.metrics["dapo/sampler/train_step"] for record in tail] == [3, 4]
    assert _replenisher(resumed).conservation_gap() == 0


@pytest.mark.parametrize(
    ("mode", "extra", "expected"),
    [
        ("separate_async", [], "not available in trainer.v1.trainer_mode=separate_async"),
        ("colocate_async", ["algorithm.filter_groups.surplus=discard"], "Set surplus=carry"),
    ],
)
def test_streaming_where_verl_cannot_stream_so_is_refused_naming_the_keys(make_trainer, mode, extra, expected):
    with pytest.raises(ValueError, match=expected):
        make_trainer(*STREAM, *extra, mode=mode, begin=False)
