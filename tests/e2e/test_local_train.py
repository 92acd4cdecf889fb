"""`dapo-verl train` end to end on a tiny config: outputs, metric keys, invariants, exact resume."""

from __future__ import annotations

import json
import math

import pytest

from dapo_verl.cli import main
from dapo_verl.local.train import run

pytestmark = pytest.mark.e2e

TINY = [
    "trainer.total_training_steps=6",
    "trainer.test_freq=3",
    "trainer.save_freq=3",
    "data.train_batch_size=4",
    "data.gen_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
    "local.task.heldout_size=50",
]
KEYS = [
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/entropy",
    "actor/grad_norm",
    "critic/score/mean",
    "response_length/mean",
    "response_length/clip_ratio",
    "actor/dapo/clip_upper_fraction",
    "actor/dapo/clip_lower_fraction",
    "actor/dapo/dual_clip_fraction",
    "actor/dapo/clip_higher_kept_fraction",
    "actor/dapo/ratio_mean",
    "actor/dapo/ratio_min",
    "actor/dapo/ratio_max",
    "dapo/sampler/keep_rate",
    "dapo/sampler/gen_rounds",
    "dapo/sampler/prefilter_acc",
    "dapo/sampler/generated_per_trained",
    "dapo/sampler/dropped/all_wrong",
]


def _comparable(records):
    """Every metric except wall-clock timings, which no two runs share."""
    return [
        {"step": r["step"], "data": {k: v for k, v in r["data"].items() if not k.startswith("timing_s/")}}
        for r in records
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("local")
    cache = [f"local.cache_dir={root / 'cache'}"]
    code = main(["train", "--out", str(root / "whole"), *TINY, *cache])
    first_half = run([*TINY, *cache, "trainer.total_training_steps=3"], root / "resumed")
    resumed = run([*TINY, *cache], root / "resumed")
    return {"code": code, "root": root, "first_half": first_half, "resumed": resumed}


def test_cli_run_writes_every_output(runs):
    assert runs["code"] == 0
    out = runs["root"] / "whole"
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "plots/training_curves.png",
        "checkpoints/global_step_3/state.safetensors",
        "checkpoints/global_step_6/state.safetensors",
        "model/config.json",
        "model/tokenizer.json",
    ):
        assert (out / name).is_file(), name
    assert (out / "checkpoints/latest_checkpointed_iteration.txt").read_text().strip() == "6"
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert (out / "plots/training_curves.png").read_bytes()[:4] == b"\x89PNG"
    environment = json.loads((out / "summary.json").read_text())["environment"]
    assert environment["torch"].startswith("2.") and environment["cpu_capability"] and environment["transformers"]


def test_metrics_jsonl_is_verl_file_logger_format_with_the_expected_keys(runs):
    lines = (runs["root"] / "whole" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5, 6]
    assert all(set(r) == {"step", "data"} for r in records)
    task = runs["resumed"].task
    assert set(records[0]["data"]) >= {f"val-core/{task}/acc/mean@1"}
    for record in records[1:]:
        missing = [k for k in KEYS if k not in record["data"]]
        assert not missing, (record["step"], missing)
        assert math.isfinite(record["data"]["actor/pg_loss"])
    assert f"val-core/{task}/acc/mean@1" in records[3]["data"]
    assert f"val-core/{task}/acc/mean@1" in records[6]["data"]


def test_only_informative_groups_are_trained_when_filtering_is_on(runs):
    for step, value in runs["resumed"].series("actor/dapo/uninformative_groups"):
        assert value == 0.0, step


def test_resume_reproduces_the_uninterrupted_run_exactly(runs):
    whole = [json.loads(line) for line in (runs["root"] / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert runs["first_half"].steps == 3
    assert runs["resumed"].resumed_from == 3
    assert _comparable(runs["resumed"].history) == _comparable(whole)


def test_without_filtering_uninformative_groups_reach_the_loss(runs):
    cache = f"local.cache_dir={runs['root'] / 'cache'}"
    result = run(
        [
            *TINY,
            cache,
            "algorithm.filter_groups.enable=false",
            "trainer.total_training_steps=3",
            "trainer.save_freq=-1",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
        ],
        runs["root"] / "unfiltered",
    )
    assert sum(value for _, value in result.series("actor/dapo/uninformative_groups")) > 0
    assert all(value == 4.0 for _, value in result.series("dapo/sampler/groups_trained"))


def test_resume_from_an_explicit_checkpoint_path_continues_that_run(runs):
    whole = [json.loads(line) for line in (runs["root"] / "whole" / "metrics.jsonl").read_text().splitlines()]
    checkpoint = runs["root"] / "whole" / "checkpoints" / "global_step_3"
    result = run(
        [
            *TINY,
            f"local.cache_dir={runs['root'] / 'cache'}",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={checkpoint}",
        ],
        runs["root"] / "from_path",
    )
    assert result.resumed_from == 3
    assert _comparable(result.history) == _comparable(whole[4:])


def test_a_step_without_loss_tokens_logs_undefined_per_token_metrics(runs):
    # A 2-token budget leaves the untrained model's responses truncated; overlong filtering masks them all.
    result = run(
        [
            "trainer.total_training_steps=2",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.val_before_train=false",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "data.max_response_length=2",
            "reward.reward_kwargs.overlong_tokens=1",
            "algorithm.overlong_filtering=true",
            "algorithm.filter_groups.enable=false",
            "local.task.heldout_size=50",
            "data.seed=0",
            f"local.cache_dir={runs['root'] / 'cache'}",
        ],
        runs["root"] / "no_loss_tokens",
        progress=True,
    )
    assert [value for _, value in result.series("actor/dapo/loss_tokens")] == [0.0, 0.0]
    assert result.series("actor/entropy") == []  # logged as null: undefined, not 0
    lines = (runs["root"] / "no_loss_tokens" / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line)["data"]["actor/entropy"] is None for line in lines)


def test_rollout_correction_weighs_carried_groups_only_and_resumes_exactly(tmp_path):
    # surplus=carry trains groups a step after they were sampled; rollout_is=token weighs their tokens against the
    # policy that sampled them. A step that trains no carried group has every weight exactly 1, and the sampling
    # log-probs of carried groups survive the checkpoint (the resumed run repeats the uninterrupted one).
    overrides = [
        *TINY,
        f"local.cache_dir={tmp_path / 'cache'}",
        "trainer.total_training_steps=8",
        "trainer.save_freq=4",
        "trainer.test_freq=4",
        "algorithm.filter_groups.surplus=carry",
        "algorithm.rollout_correction.rollout_is=token",
        "data.gen_batch_size=16",
    ]
    whole = run(overrides, tmp_path / "whole")
    run([*overrides, "trainer.total_training_steps=4"], tmp_path / "resumed")
    resumed = run(overrides, tmp_path / "resumed")
    assert _comparable(resumed.history) == _comparable(whole.history)
    trained = [r["data"] for r in whole.history if r["step"] > 0 and r["data"].get("dapo/sampler/groups_trained")]
    assert trained and all("rollout_corr/rollout_is_mean" in d for d in trained)
    fresh = [d for d in trained if d["dapo/sampler/groups_from_carry"] == 0]
    carried = [d for d in trained if d["dapo/sampler/groups_from_carry"] > 0]
    assert fresh and carried, "the scenario must train steps with and without carried groups"
    assert all(d["rollout_corr/rollout_is_min"] == d["rollout_corr/rollout_is_max"] == 1.0 for d in fresh)
    assert any(d["rollout_corr/rollout_is_min"] != d["rollout_corr/rollout_is_max"] for d in carried)


def test_rollout_correction_with_streaming_is_refused_naming_both_keys(tmp_path):
    with pytest.raises(ValueError, match=r"rollout_is=token with algorithm\.filter_groups\.streaming=true"):
        run(
            [
                *TINY,
                f"local.cache_dir={tmp_path / 'cache'}",
                "algorithm.filter_groups.streaming=true",
                "algorithm.filter_groups.surplus=carry",
                "algorithm.rollout_correction.rollout_is=token",
            ],
            tmp_path / "r",
        )
