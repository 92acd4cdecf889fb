"""Local runs and dynamic sampling: no per-step warning for partial batches, one summary line, the optional stop."""

from __future__ import annotations

import logging

from dapo_verl.local.train import partial_batch_summary, run

_TINY = [
    "data.train_batch_size=4",
    "data.gen_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.save_freq=-1",
    "trainer.resume_mode=disable",
]


def _capture_info(caplog):
    """INFO from the package's loggers, whatever level an earlier test left on them (restored afterwards)."""
    for name in ("dapo_verl", "dapo_verl.local.train", "dapo_verl.sampler.replenisher"):
        caplog.set_level(logging.INFO, logger=name)


def test_partial_batches_give_no_warning_and_one_summary_line(tmp_path, caplog):
    overrides = [
        *_TINY,
        "trainer.total_training_steps=3",
        "algorithm.filter_groups.max_num_gen_batches=1",
        f"local.cache_dir={tmp_path / 'cache'}",
    ]  # one 8-prompt round cannot fill 4 groups at a 30% keep rate
    _capture_info(caplog)
    result = run(overrides, tmp_path / "run")
    partial = sum(value for _, value in result.series("dapo/sampler/partial"))
    assert partial >= 1
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Dynamic sampling: ")]
    assert len(summaries) == 1 and f"{partial:.0f} of 3 steps (the first at step " in summaries[0]
    assert "answered most training prompts wrong" in summaries[0] and "max_num_gen_batches" in summaries[0]
    assert not [r for r in caplog.records if r.name == "dapo_verl.sampler.replenisher"]


def test_stop_when_exhausted_ends_the_run_with_its_last_evaluation_and_checkpoint(tmp_path, caplog):
    overrides = [
        *_TINY,
        "trainer.total_training_steps=40",
        "trainer.test_freq=100",
        "trainer.save_freq=100",
        "algorithm.filter_groups.stop_when_exhausted=true",
        "algorithm.filter_groups.exhausted_streak=1",
        "algorithm.filter_groups.exhausted_pool_fraction=0.002",
        f"local.cache_dir={tmp_path / 'cache'}",
    ]
    _capture_info(caplog)
    result = run(overrides, tmp_path / "run")
    assert result.steps < 40  # 0.2% of 9,800 prompts all-wrong once: within the first steps
    assert result.history[-1]["step"] == result.steps
    assert "val-core/copy3/acc/mean@1" in result.history[-1]["data"]  # the last step is evaluated ...
    assert (tmp_path / "run" / "checkpoints" / f"global_step_{result.steps}").is_dir()  # ... and saved
    assert result.history[-1]["data"]["dapo/sampler/pool_exhausted"] == 1.0
    assert any("stop_when_exhausted" in r.getMessage() for r in caplog.records)


def test_the_summary_says_a_saturating_task_is_expected_and_a_failing_one_needs_more_rounds():
    saturated = partial_batch_summary({93: 0.93, 94: 0.95, 150: 1.0}, steps=200, idle_steps=1, batch_groups=32)
    assert saturated.startswith(
        "Dynamic sampling: 3 of 200 steps (the first at step 93) trained on fewer than the "
        "32 groups a batch asks for, 1 of them on none."
    )
    assert "the task saturating, expected once it is learned" in saturated and "accuracy 0.96" in saturated
    assert "max_num_gen_batches" not in saturated
    failing = partial_batch_summary({1: 0.04, 2: 0.1}, steps=10, idle_steps=0, batch_groups=4)
    assert "answered most training prompts wrong" in failing and "max_num_gen_batches" in failing
    assert "saturating" not in failing
