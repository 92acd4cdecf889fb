"""verl's real v1 trainer (its default), through ``dapo-verl rehearse --engine stand-in``: Ray workers, FSDP2 on gloo,
dapo_verl's CPU rollout replica in place of vLLM (the same trainer on real vLLM: test_rehearse_vllm.py).

Every assertion reads what verl itself wrote -- its file logger's JSONL and its checkpoint folders -- never
dapo_verl's objects. The runs are small (tiny stand-in model, 4 prompts a step) but go through the same code a
cluster run does: verl's trainer, workers, agent loop, reward loop, checkpoint manager and weight sync.
"""

from __future__ import annotations

import json

import pytest

from dapo_verl.rehearsal.report import read_jsonl
from tests.e2e.rehearsal_helpers import CARRY, SIZES, assert_dapo_metrics_every_step, run_rehearsal, training_steps

pytestmark = [pytest.mark.slow, pytest.mark.verl, pytest.mark.e2e]


def test_v1_sync_trains_with_the_replenisher_and_resumes_exactly_on_the_stand_in(tmp_path, memory_heavy):
    # The default path: the resume run starts with the first and waits at verl's checkpoint load for it.
    report, logged, out = run_rehearsal(
        tmp_path, "dapo_trainer", "actor_rollout_ref.rollout.n=4", *SIZES, *CARRY, overlap=True, engine="stand-in"
    )
    assert report["rollout_engine"] == "stand-in" and "--engine stand-in" in report["engine_reason"]
    changes = json.loads((out / "changes.json").read_text())
    assert {"key": "actor_rollout_ref.rollout.name", "rehearsal": "dapo_cpu"}.items() <= next(
        c for c in changes if c["key"] == "actor_rollout_ref.rollout.name"
    ).items()
    assert "weight_sync" not in report  # the probe is for vLLM; the replica is dapo_verl's own code
    trained = assert_dapo_metrics_every_step(logged, 3)
    run2_log = (out / "run2" / "log.txt").read_text()
    assert "waiting for the first run's checkpoint before loading it" in run2_log  # it did start early and wait
    assert report["ok"], report
    # Both runs' processes were measured, the resume run's while the first run's were up too.
    memory = report["memory"]
    assert memory["overlap_resume"] is True and 2**30 < report["peak_rss_bytes"] < 24 * 2**30, memory
    assert 2**29 < report["peak_pss_bytes"] < report["peak_rss_bytes"], memory
    assert all(run["peak_processes"] > 5 and run["peak_rss_bytes"] > 2**29 for run in report["runs"]), report["runs"]
    # verl's checkpoint folder holds the sampler's state, written by dapo_verl's checkpoint callback.
    assert (out / "run1" / "checkpoints" / "global_step_2" / "dapo_sampler.safetensors").is_file()
    assert (out / "run2" / "checkpoints" / "global_step_3" / "dapo_sampler.safetensors").is_file()
    # Surplus was carried within the run; a checkpointed step carries none (sync mode does not save the queue).
    assert sum(data["dapo/sampler/groups_from_carry"] for data in trained.values()) > 0
    assert trained[2]["dapo/sampler/carried_groups"] == 0 and trained[3]["dapo/sampler/carried_groups"] == 0
    assert trained[3]["dapo/sampler/history_size"] > 0
    # The resumed run's step 3 equals the uninterrupted run's step 3: the sampler's decisions, the data, rewards and
    # advantages exactly; the update's statistics up to the order in which a group's responses arrived.
    assert report["resume"]["data_identical"], report["resume"]["differences"]
    assert report["resume"]["update_max_rel_diff"] < 1e-3, report["resume"]["differences"]
    assert report["resume"]["compared"] > 50
    resumed = training_steps(read_jsonl(out / "run2" / "metrics.jsonl"))
    assert sorted(resumed) == [3] and resumed[3]["dapo/sampler/train_step"] == 3
