"""verl's own RayPPOTrainer.fit, driven on CPU with fakes, with dapo_verl's replenisher producing batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

pytestmark = pytest.mark.verl

from dapo_verl.adapter.trainer import SAMPLER_STATE_FILE  # noqa: E402
from dapo_verl.main import validate_dapo_config  # noqa: E402
from dapo_verl.sampler import ShortfallError  # noqa: E402
from tests.integration.fake_verl import build_trainer, compose_config  # noqa: E402

CARRY = [
    "data.gen_batch_size=8",
    "algorithm.filter_groups.refill=barrier",
    "algorithm.filter_groups.surplus=carry",
    "algorithm.filter_groups.skip_uninformative=false",
    "algorithm.filter_groups.revisit_informative=false",
]


def _fit(tmp_path, monkeypatch, steps, *extra, log="log.jsonl", **kwargs):
    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / log))
    trainer = build_trainer(compose_config(tmp_path, f"trainer.total_training_steps={steps}", *extra), **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit()
    logged = [json.loads(line) for line in (tmp_path / log).read_text().splitlines()]
    return trainer, {entry["step"]: entry["data"] for entry in logged}


def test_every_update_gets_a_full_batch_of_informative_contiguous_groups(tmp_path, monkeypatch):
    trainer, metrics = _fit(tmp_path, monkeypatch, 3, *CARRY)
    updates = trainer.actor_rollout_wg.updates
    assert len(updates) == 3  # training steps, although the rollout manager was called more often
    assert len(trainer.async_rollout_manager.real.calls) > 3
    for update in updates:
        assert len(update["uid"]) == 4 * 4
        groups: dict[str, list[bool]] = {}
        for uid, acc in zip(update["uid"], update["acc"]):
            groups.setdefault(uid, []).append(acc)
        assert len(groups) == 4
        assert all(0 < sum(accs) < len(accs) for accs in groups.values())  # no all-right/all-wrong group
        assert all(index % 3 == 2 for index in update["index"])
    assert any(step["dapo/sampler/groups_from_carry"] > 0 for step in metrics.values())
    for step in metrics.values():
        for key in (
            "dapo/sampler/gen_rounds",
            "dapo/sampler/prefilter_acc",
            "dapo/sampler/dropped/all_correct",
            "dapo/sampler/dropped/all_wrong",
            "dapo/sampler/train_step",
            "timing_s/dapo_sampling",
        ):
            assert key in step
        assert step["dapo/sampler/prefilter_acc"] < 1.0
    assert os.path.exists(tmp_path / "ckpt" / "global_step_3" / SAMPLER_STATE_FILE)


def test_training_epoch_follows_the_sampler_passes_over_the_data(tmp_path, monkeypatch):
    # 24 prompts, about 6 consumed per step: the sampler starts a new pass every few steps.
    _, metrics = _fit(tmp_path, monkeypatch, 10, *CARRY)
    steps = sorted(s for s in metrics if s > 0)
    assert len(steps) == 10  # the run still ends at total_training_steps
    labels = [metrics[s]["training/epoch"] for s in steps]
    passes = [metrics[s]["dapo/sampler/data_epoch"] for s in steps]
    assert labels == sorted(labels) and labels[-1] >= 1  # it advances (it stayed 0 before)
    # A step is labelled with the pass its first prompts came from: the previous step's data epoch.
    assert labels == [0, *passes[:-1]]


def test_odd_group_sizes_split_evenly_over_the_agent_loop_workers(tmp_path, monkeypatch):
    # n=3 over 2 workers: an odd prompt count gives an odd row count, which DataProto.chunk refuses.
    trainer, metrics = _fit(tmp_path, monkeypatch, 3, "actor_rollout_ref.rollout.n=3")
    assert len(trainer.actor_rollout_wg.updates) == 3
    assert all(rows % 2 == 0 for rows in trainer.async_rollout_manager.real.calls)
    assert sum(step["dapo/rollout/padding_responses"] for step in metrics.values() if step) > 0


def test_partial_batches_are_topped_up_to_whole_mini_batches_on_both_ranks(tmp_path, monkeypatch):
    # One round of 4 prompts finds about one mixed group in three: short batches, trained anyway.
    trainer, metrics = _fit(
        tmp_path,
        monkeypatch,
        3,
        "algorithm.filter_groups.on_shortfall=partial",
        "algorithm.filter_groups.max_num_gen_batches=1",
        "algorithm.filter_groups.refill=barrier",
        "data.gen_batch_size=4",
    )
    updates = trainer.actor_rollout_wg.updates
    assert all(metrics[step]["dapo/sampler/partial"] == 1 for step in (1, 2, 3))
    for step, update in zip((1, 2, 3), updates):
        assert len(update["uid"]) % (2 * 4) == 0  # whole mini-batches of 2 prompts x 4 responses, on 2 ranks
        padding = int(metrics[step]["dapo/rollout/padding_groups"])
        groups = len(update["uid"]) // 4
        assert groups == metrics[step]["dapo/sampler/groups_trained"] + padding
    padded = [(step, u) for step, u in zip((1, 2, 3), updates) if metrics[step]["dapo/rollout/padding_groups"]]
    assert padded  # a batch of one group was topped up with a no-op group ...
    for _, update in padded:
        per_row = update["advantages"].abs().sum(-1)
        assert int((per_row == 0).sum()) >= 4  # ... whose responses carry no advantage


def test_partial_batches_of_odd_groups_split_into_log_prob_micro_batches_on_both_ranks(tmp_path, monkeypatch):
    # n=3 on 2 ranks with log-prob micro-batches of 2: a batch needs a multiple of 4 groups (12 rows, 6 per rank),
    # more than whole mini-batches (2 groups) and an even row count (2 groups) ask for.
    trainer, metrics = _fit(
        tmp_path,
        monkeypatch,
        3,
        "actor_rollout_ref.rollout.n=3",
        "algorithm.filter_groups.on_shortfall=partial",
        "algorithm.filter_groups.max_num_gen_batches=1",
        "algorithm.filter_groups.refill=barrier",
        "data.gen_batch_size=4",
    )
    for step, update in zip((1, 2, 3), trainer.actor_rollout_wg.updates):
        assert len(update["uid"]) % (2 * 2 * 3) == 0
        groups = len(update["uid"]) // 3
        assert groups == metrics[step]["dapo/sampler/groups_trained"] + metrics[step]["dapo/rollout/padding_groups"]


def test_stop_when_exhausted_ends_the_run_with_a_checkpoint(tmp_path, monkeypatch):
    # Two prompts in three are always all-correct or all-wrong: after 2 visits each, 2/3 of the pool is exhausted.
    trainer, metrics = _fit(
        tmp_path,
        monkeypatch,
        30,
        *CARRY,
        "algorithm.filter_groups.stop_when_exhausted=true",
        "algorithm.filter_groups.exhausted_streak=2",
        "algorithm.filter_groups.exhausted_pool_fraction=0.5",
    )
    steps = sorted(s for s in metrics if s > 0)
    assert len(steps) < 30 and trainer.total_training_steps == steps[-1]
    assert metrics[steps[-1]]["dapo/sampler/pool_exhausted_fraction"] >= 0.5
    assert all(metrics[s]["dapo/sampler/pool_exhausted_fraction"] < 0.5 for s in steps[:-1])
    assert (tmp_path / "ckpt" / f"global_step_{steps[-1]}" / SAMPLER_STATE_FILE).exists()


def test_run_length_and_lr_schedule_count_training_steps(tmp_path, monkeypatch):
    trainer, _ = _fit(tmp_path, monkeypatch, 2, *CARRY)
    assert trainer.total_training_steps == 2
    assert trainer.config.actor_rollout_ref.actor.optim.total_training_steps == 2
    assert trainer.sampler.train_steps == 2


def test_resume_continues_exactly_with_the_carried_group(tmp_path, monkeypatch):
    straight, straight_metrics = _fit(tmp_path / "a", monkeypatch, 4, *CARRY)
    _first, first_metrics = _fit(tmp_path / "b", monkeypatch, 3, *CARRY)
    assert first_metrics[3]["dapo/sampler/carried_groups"] == 1  # a group is carried across the checkpoint
    resumed, resumed_metrics = _fit(tmp_path / "b", monkeypatch, 4, *CARRY, log="log2.jsonl")
    assert resumed.actor_rollout_wg.loaded and resumed.actor_rollout_wg.loaded[-1].endswith("global_step_3/actor")
    assert len(resumed.actor_rollout_wg.updates) == 1
    assert resumed.actor_rollout_wg.updates[0]["index"] == straight.actor_rollout_wg.updates[3]["index"]
    sampler_keys = [k for k in straight_metrics[4] if k.startswith("dapo/sampler/")]
    assert {k: resumed_metrics[4][k] for k in sampler_keys} == {k: straight_metrics[4][k] for k in sampler_keys}
    assert resumed_metrics[4]["dapo/sampler/groups_from_carry"] == 1
    assert resumed.sampler.conservation_gap() == 0


def test_hopeless_data_stops_with_the_knob_to_turn(tmp_path, monkeypatch):
    with pytest.raises(ShortfallError, match="raise algorithm.filter_groups.max_num_gen_batches.*on_shortfall=partial"):
        _fit(tmp_path, monkeypatch, 2, "algorithm.filter_groups.max_num_gen_batches=2", mixed_prompts=False)


def test_validation_requests_pass_through_to_the_real_rollout_manager(tmp_path, monkeypatch):
    _trainer, metrics = _fit(tmp_path, monkeypatch, 1, "trainer.val_before_train=True", *CARRY)
    assert any(key.startswith("val-core/") for key in metrics[0])


def test_dapo_config_checks(tmp_path):
    validate_dapo_config(compose_config(tmp_path, "trainer.use_v1=true"))  # v1 runs the replenisher as its sampler
    with pytest.raises(ValueError, match="trainer.v1.sampler.custom_sampler is .*DapoReplayBuffer"):
        validate_dapo_config(
            compose_config(tmp_path, "trainer.use_v1=true", "trainer.v1.sampler.custom_sampler.name=X")
        )
    with pytest.raises(ValueError, match="trainer.checkpoint_callback_class=None: without"):
        validate_dapo_config(compose_config(tmp_path, "trainer.use_v1=true", "trainer.checkpoint_callback_class=null"))
    with pytest.raises(ValueError, match="a colocated reward model scores responses only after generation"):
        validate_dapo_config(compose_config(tmp_path, "reward.reward_model.enable=true"))
    with pytest.raises(ValueError, match="actor_rollout_ref.rollout.n=1"):
        validate_dapo_config(compose_config(tmp_path, "actor_rollout_ref.rollout.n=1"))
    with pytest.raises(ValueError, match="overlong_tokens=4096 exceeds data.max_response_length=6"):
        validate_dapo_config(compose_config(tmp_path, "reward.reward_kwargs.overlong_tokens=4096"))
    with pytest.warns(UserWarning, match="clip_ratio_high has no effect"):
        validate_dapo_config(compose_config(tmp_path, "actor_rollout_ref.actor.ppo_mini_batch_size=4"))


@pytest.mark.slow
def test_main_shows_the_resolved_dapo_config_without_starting_anything():
    job = subprocess.run(
        [sys.executable, "-m", "dapo_verl.main", "--cfg", "job"], capture_output=True, text=True, check=True
    )
    assert "loss_mode: dapo" in job.stdout and "adv_estimator: dapo" in job.stdout
    assert "name: dapo_verl" in job.stdout and "use_v1: true" in job.stdout
    assert "path: pkg://dapo_verl.adapter.v1_sampler" in job.stdout and "name: DapoReplayBuffer" in job.stdout
    usage = subprocess.run(
        [sys.executable, "-m", "dapo_verl.main", "--help"], capture_output=True, text=True, check=True
    )
    assert "Override anything in the config" in usage.stdout


class _Planted:
    def __reduce__(self):
        return (os.system, ("touch PLANTED",))


def test_a_planted_dataloader_pickle_is_refused_before_verl_loads_it(tmp_path, monkeypatch):
    import torch

    _fit(tmp_path, monkeypatch, 1, *CARRY)
    torch.save({"state": _Planted()}, tmp_path / "ckpt" / "global_step_1" / "data.pt")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="Refusing to resume from .*data.pt"):
        _fit(tmp_path, monkeypatch, 2, *CARRY, log="log2.jsonl")
    assert not (tmp_path / "PLANTED").exists()
