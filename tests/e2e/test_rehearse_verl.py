"""verl's legacy trainer on two ranks, through ``dapo-verl rehearse --engine stand-in`` (Ray, FSDP2 on gloo, the CPU
replica); a bad recipe fails as on a cluster. verl's main_ppo and the legacy trainer on real vLLM:
test_rehearse_vllm.py.

Every assertion reads what verl itself wrote -- its file logger's JSONL and its checkpoint folders -- never
dapo_verl's objects. The runs are small (tiny stand-in model, 4 prompts a step) but go through the same code a
cluster run does: verl's trainer, workers, agent loop, reward loop, checkpoint manager and weight sync.
"""

from __future__ import annotations

import pytest

from dapo_verl.rehearsal.run import RehearsalOptions, rehearse
from tests.e2e.rehearsal_helpers import SIZES, assert_dapo_metrics_every_step, run_rehearsal

pytestmark = [pytest.mark.slow, pytest.mark.verl, pytest.mark.e2e]


# A mini-batch of 2 prompts x 3 responses is 3 rows on each of 2 ranks: micro-batches of 3 (verl asserts they divide).
ODD_SIZES = [s for s in SIZES if "ppo_micro_batch_size_per_gpu" not in s] + [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"
]


def test_legacy_trainer_on_two_ranks_with_odd_n_and_partial_batches(tmp_path):
    # Two data-parallel ranks, n=3 over two agent-loop workers: every request must be padded to split evenly
    # (verl's DataProto.chunk refuses a remainder). One round of 3 prompts (9 rows) per step with
    # on_shortfall=partial: always short, topped up to whole mini-batches that verl's rank balancing can split.
    report, logged, out = run_rehearsal(
        tmp_path,
        "dapo_trainer",
        "trainer.use_v1=false",
        "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        "algorithm.filter_groups.max_num_gen_batches=1",
        "algorithm.filter_groups.refill=barrier",
        "data.gen_batch_size=3",
        "algorithm.filter_groups.on_shortfall=partial",
        "algorithm.filter_groups.surplus=carry",
        *ODD_SIZES,
        gpus=2,
        steps=2,
        resume=False,  # the legacy trainer's resume: test_rehearse_vllm.py (exact, one replica)
        engine="stand-in",
    )  # two vLLM engines would need ~13 GB
    assert report["ok"], report
    trained = assert_dapo_metrics_every_step(logged, 2)
    assert any(data["dapo/sampler/partial"] == 1 for data in trained.values())
    assert any(data["dapo/rollout/padding_responses"] > 0 for data in trained.values())
    assert any(data["dapo/rollout/padding_groups"] > 0 for data in trained.values())
    assert all(data["timing_s/gen"] >= data["timing_s/dapo_sampling"] for data in trained.values())
    # Both ranks trained: verl balanced each batch over 2 partitions.
    assert all("global_seqlen/balanced_max" in data for data in trained.values())
    assert (out / "run1" / "checkpoints" / "global_step_1" / "dapo_sampler.safetensors").is_file()


def test_a_recipe_whose_data_lacks_the_prompt_column_fails_with_verls_own_error(tmp_path):
    # The recipe's data file is used as it is (first rows), so a schema mistake fails here as on the cluster.
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "no_prompt.parquet"
    pq.write_table(
        pa.table(
            {
                "question": ["What is 2 - 1?"] * 8,
                "data_source": ["math_dapo"] * 8,
                "reward_model": [{"ground_truth": "1", "style": "rule"}] * 8,
            }
        ),
        bad,
    )
    options = RehearsalOptions(
        config_name="dapo_trainer",
        overrides=(f"data.train_files={bad}", f"data.val_files={bad}", "actor_rollout_ref.rollout.n=4", *SIZES),
        out_dir=tmp_path / "rehearsal",
        timeout_s=600,
        overlap=False,  # run1 fails: no resume run to start early
        engine="stand-in",
    )
    report = rehearse(options, echo=lambda line: None).report
    assert not report["ok"]
    # no resume after a failed first run, and the report says why
    assert [(run["name"], run["state"]) for run in report["runs"]] == [
        ("run1", "failed"),
        ("run2 (resume)", "not started"),
    ]
    run = report["runs"][0]
    assert run["returncode"] != 0
    assert "prompt" in run["error"], run["error"]  # verl's dataset names the missing key
    assert "prompt" in (options.out_dir / "report.md").read_text()
