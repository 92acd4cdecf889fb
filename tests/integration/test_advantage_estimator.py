"""adv_estimator=dapo through verl: equal to grpo, reads its settings from the algorithm config."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, get_adv_estimator_fn  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from dapo_verl.adapter.advantages import compute_dapo_outcome_advantage  # noqa: E402


def _batch(gen, rows=12, length=5, binary=False):
    mask = (torch.rand(rows, length, generator=gen) > 0.2).double()
    mask[:, 0] = 1
    scores = (
        torch.randint(0, 2, (rows,), generator=gen).double() * 2 - 1
        if binary
        else torch.randn(rows, generator=gen, dtype=torch.float64)
    )
    rewards = torch.zeros(rows, length, dtype=torch.float64)
    last = mask.sum(-1).long() - 1
    rewards[torch.arange(rows), last] = scores
    order = torch.randperm(rows - 1, generator=gen).tolist()
    uids = np.array([f"u{i % 3}" for i in order] + ["singleton"], dtype=object)  # groups of 3-4, interleaved
    return rewards, mask, uids


def _assert_equal_to_grpo(ours, theirs):
    torch.testing.assert_close(ours[:-1], theirs[:-1], rtol=1e-12, atol=1e-12)
    # The last row is a group of one. verl keeps that group's mean 0 and std 1 as float32 constants, so its
    # denominator is float32(1 + eps); ours is 1 + eps in the scores' dtype (a 5e-8 relative gap).
    torch.testing.assert_close(ours[-1], theirs[-1], rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("binary", [True, False])
def test_equals_grpo_in_float64(gen, norm, binary):
    for _ in range(5):
        rewards, mask, uids = _batch(gen, binary=binary)
        ours, returns = compute_dapo_outcome_advantage(rewards, mask, {"norm_adv_by_std_in_grpo": norm}, uids)
        theirs, _ = compute_grpo_outcome_advantage(rewards, mask, uids, norm_adv_by_std_in_grpo=norm)
        _assert_equal_to_grpo(ours, theirs)
        assert torch.equal(ours, returns)


def test_epsilon_is_read_from_the_algorithm_config(gen):
    rewards, mask, uids = _batch(gen)
    ours, _ = compute_dapo_outcome_advantage(rewards, mask, OmegaConf.create({"adv_epsilon": 0.5}), uids)
    theirs, _ = compute_grpo_outcome_advantage(rewards, mask, uids, epsilon=0.5)
    torch.testing.assert_close(ours[:-1], theirs[:-1], rtol=1e-12, atol=1e-12)


def test_zero_on_padding_and_for_zero_spread_groups(gen):
    rewards, mask, _ = _batch(gen, rows=6)
    rewards[:3] = rewards[:3].clamp(min=0) * 0 + rewards[0]  # rows 0-2 share one reward vector
    uids = np.array(["same"] * 3 + ["x", "x", "y"], dtype=object)
    adv, _ = compute_dapo_outcome_advantage(rewards, mask, None, uids)
    assert torch.all(adv[mask == 0] == 0)
    assert torch.all(adv[:3] == 0)


def test_through_verl_compute_advantage_with_dataproto(gen):
    rewards, mask, uids = _batch(gen)
    results = {}
    for estimator in ("dapo", "grpo"):
        data = DataProto.from_dict(
            tensors={"token_level_rewards": rewards, "response_mask": mask}, non_tensors={"uid": uids}
        )
        out = compute_advantage(data, adv_estimator=estimator, config=AlgoConfig(adv_estimator=estimator))
        results[estimator] = out.batch["advantages"]
    _assert_equal_to_grpo(results["dapo"], results["grpo"])
    assert get_adv_estimator_fn("dapo") is compute_dapo_outcome_advantage


def test_missing_uid_is_a_clear_error(gen):
    rewards, mask, _ = _batch(gen)
    with pytest.raises(ValueError, match="needs the per-row uid"):
        compute_dapo_outcome_advantage(rewards, mask, None, None)


def test_bad_setting_names_the_key(gen):
    rewards, mask, uids = _batch(gen)
    with pytest.raises(ValueError, match="algorithm.adv_epsilon=-1 must be >= 0.0"):
        compute_dapo_outcome_advantage(rewards, mask, {"adv_epsilon": -1}, uids)


def _v1_batch(gen, sessions_outputs):
    """A v1 batch: one prompt (uid "p"), sessions with 1 or more outputs, keys ``p_{session}_{output}``."""
    keys = [f"p_{s}_{o}" for s, outputs in enumerate(sessions_outputs) for o in range(outputs)]
    rows, length = len(keys), 4
    mask = torch.ones(rows, length, dtype=torch.float64)
    rewards = torch.zeros(rows, length, dtype=torch.float64)
    rewards[:, -1] = torch.randint(0, 2, (rows,), generator=gen).double() * 2 - 1
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": np.array(["p"] * rows, dtype=object)},
    )
    return data, keys


@pytest.mark.parametrize("sessions", [[1, 1, 1, 1], [2, 1, 3, 1]])
def test_v1_multi_output_sessions_the_documented_difference_from_grpo(gen, sessions):
    """verl's v1 trainer special-cases its own GRPO enum: with sessions that emit several outputs (multi-turn
    agent loops) only each session's final output enters the group statistics. ``adv_estimator=dapo`` cannot see
    sessions (verl passes estimators rows and uids only), so it normalises over every output. With one output per
    session -- every single-turn rollout, every dapo_verl recipe -- the two are equal."""
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    data, keys = _v1_batch(gen, sessions)
    config = OmegaConf.create({"norm_adv_by_std_in_grpo": True})
    results = {}
    for name in ("grpo", "dapo"):
        out = compute_advantage_for_multi_trajectories(
            data.slice(0, len(data)), batch_keys=keys, adv_estimator=name, num_repeat=len(sessions), config=config
        )
        results[name] = out.batch["advantages"][:, 0]
    if max(sessions) == 1:
        torch.testing.assert_close(results["dapo"], results["grpo"], rtol=1e-6, atol=1e-6)
    else:
        session = [key.split("_")[1] for key in keys]
        finals = [i for i in range(len(keys)) if i + 1 == len(keys) or session[i + 1] != session[i]]
        grpo_finals = results["grpo"][finals]
        expected = compute_dapo_outcome_advantage(
            data.batch["token_level_rewards"][finals],
            data.batch["response_mask"][finals],
            config,
            np.array(["p"] * len(finals), dtype=object),
        )[0][:, 0]
        torch.testing.assert_close(grpo_finals, expected, rtol=1e-6, atol=1e-6)  # GRPO: final outputs only
        assert not torch.allclose(results["dapo"], results["grpo"])  # dapo: every output counts
