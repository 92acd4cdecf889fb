"""The dapo policy loss through verl's own code: equal to vanilla, exact under micro-batches and DP ranks."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.verl

from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, get_policy_loss_fn  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from dapo_verl.adapter.losses import compute_policy_loss_dapo  # noqa: E402
from dapo_verl.core import aggregate_loss, clipped_surrogate_loss_matrix  # noqa: E402
from tests.integration.conftest import actor_config, micro_batch, random_rollout  # noqa: E402
from tools.dispatch_probes import count_host_syncs  # noqa: E402


def _direct(gen, dtype=torch.float64, spread=1.0, b=6, length=7):
    logp = (-torch.rand(b, length, generator=gen, dtype=dtype) * 2).requires_grad_(True)
    old = logp.detach() + spread * torch.randn(b, length, generator=gen, dtype=dtype)
    mask = torch.rand(b, length, generator=gen) > 0.25
    adv = torch.randn(b, 1, generator=gen, dtype=dtype).expand(b, length) * mask
    return logp, old, adv, mask


@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum", "seq-mean-token-sum-norm"]
)
@pytest.mark.parametrize("with_weights", [False, True])
def test_equals_vanilla_loss_and_gradient_in_float64(gen, agg, with_weights):
    for _trial in range(3):
        logp, old, adv, mask = _direct(gen)
        weights = torch.rand(logp.shape, generator=gen, dtype=logp.dtype) * 2 if with_weights else None
        config = actor_config(high=0.28, c=3.0, agg=agg)
        ours, metrics = compute_policy_loss_dapo(
            old_log_prob=old,
            log_prob=logp,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode=agg,
            config=config,
            rollout_is_weights=weights,
        )
        (our_grad,) = torch.autograd.grad(ours, logp)
        theirs, their_metrics = compute_policy_loss_vanilla(
            old_log_prob=old,
            log_prob=logp,
            advantages=adv,
            response_mask=mask,
            loss_agg_mode=agg,
            config=config,
            rollout_is_weights=weights,
        )
        (their_grad,) = torch.autograd.grad(theirs, logp)
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(our_grad, their_grad, rtol=1e-12, atol=1e-14)
        for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
            assert metrics[key] == pytest.approx(their_metrics[key], rel=1e-6, abs=1e-9), key


def test_clip_ratio_fallback_matches_vanilla(gen):
    logp, old, adv, mask = _direct(gen)
    config = actor_config(low=None, high=None, clip_ratio=0.15)
    ours, _ = compute_policy_loss_dapo(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, config=config
    )
    theirs, _ = compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, config=config
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-14)


def test_dapo_metrics_split_the_clip_fraction(gen):
    logp, old, adv, mask = _direct(gen, spread=0.3)
    _, metrics = compute_policy_loss_dapo(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, config=actor_config()
    )
    assert metrics["actor/pg_clipfrac"] == pytest.approx(
        metrics["actor/dapo/clip_upper_fraction"] + metrics["actor/dapo/clip_lower_fraction"]
    )
    for key in ("clip_higher_kept_fraction", "dual_clip_fraction", "ratio_mean", "ratio_min", "ratio_max"):
        assert f"actor/dapo/{key}" in metrics
    assert all(isinstance(v, float) for v in metrics.values())


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
def test_dapo_waits_for_the_device_no_more_often_than_vanilla(gen, mask_dtype):
    logp, old, adv, mask = _direct(gen, dtype=torch.float32, spread=0.3)
    syncs = {}
    for mode in ("vanilla", "dapo"):
        leaf = logp.detach().clone().requires_grad_(True)
        with count_host_syncs() as syncs[mode]:
            loss, _metrics = get_policy_loss_fn(mode)(
                old_log_prob=old,
                log_prob=leaf,
                advantages=adv,
                response_mask=mask.to(mask_dtype),
                loss_agg_mode="token-mean",
                config=actor_config(mode),
            )
            loss.backward()
    assert syncs["vanilla"] == ["aten::_local_scalar_dense"] * 3  # one .item() per metric
    assert len(syncs["dapo"]) <= len(syncs["vanilla"])
    assert syncs["dapo"] == ["Tensor.tolist", "Tensor.tolist"]  # the core's checks, then the metrics


def _grad_via_ppo_loss(rollout, loss_mode, partition, *, dp_size):
    """Sum micro-batch gradients per simulated rank, then average over ranks as DDP/FSDP does."""
    config = actor_config(loss_mode)
    total_tokens = int(rollout["response_mask"].sum())
    batch = rollout["response_mask"].shape[0]
    full = rollout["full_logp"]
    rank_grads, losses = [], []
    for rank_rows in partition:
        grad = torch.zeros_like(full)
        for rows in rank_rows:
            output, td = micro_batch(
                rollout, rows, dp_size=dp_size, batch_num_tokens=total_tokens, global_batch_size=batch
            )
            loss, _metrics = ppo_loss(config, output, td)
            (g,) = torch.autograd.grad(loss, full)
            grad += g
            losses.append(float(loss))
        rank_grads.append(grad)
    return torch.stack(rank_grads).mean(0), sum(losses) / dp_size


@pytest.mark.parametrize("loss_mode", ["dapo", "vanilla"])
def test_gradient_is_invariant_to_micro_batch_and_data_parallel_split(gen, loss_mode):
    rollout = random_rollout(gen, batch=8)
    rows = torch.randperm(8, generator=gen)
    whole, whole_loss = _grad_via_ppo_loss(rollout, loss_mode, [[rows]], dp_size=1)
    micro, micro_loss = _grad_via_ppo_loss(rollout, loss_mode, [[rows[:3], rows[3:5], rows[5:]]], dp_size=1)
    ranks, ranks_loss = _grad_via_ppo_loss(
        rollout, loss_mode, [[rows[:2], rows[2:4]], [rows[4:5], rows[5:]]], dp_size=2
    )
    torch.testing.assert_close(micro, whole, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(ranks, whole, rtol=1e-12, atol=1e-15)
    assert micro_loss == pytest.approx(whole_loss, rel=1e-12)
    assert ranks_loss == pytest.approx(whole_loss, rel=1e-12)


def test_ppo_loss_runs_dapo_and_equals_vanilla_with_backward(gen):
    rollout = random_rollout(gen, batch=5)
    rows = torch.arange(5)
    tokens = int(rollout["response_mask"].sum())
    results = {}
    for mode in ("dapo", "vanilla"):
        output, td = micro_batch(rollout, rows, dp_size=1, batch_num_tokens=tokens, global_batch_size=5)
        loss, metrics = ppo_loss(actor_config(mode), output, td)
        loss.backward()
        results[mode] = (float(loss), rollout["full_logp"].grad.clone(), metrics)
        rollout["full_logp"].grad = None
    assert results["dapo"][0] == pytest.approx(results["vanilla"][0], rel=1e-12)
    torch.testing.assert_close(results["dapo"][1], results["vanilla"][1], rtol=1e-12, atol=1e-15)
    assert "actor/dapo/clip_upper_fraction" in results["dapo"][2]
    assert get_policy_loss_fn("dapo") is compute_policy_loss_dapo


def test_group_token_mean_through_verl_aggregation_equals_the_core_per_group_mean(gen):
    from dapo_verl.adapter.advantages import compute_dapo_outcome_advantage
    from dapo_verl.core import group_advantages_by_index

    logp, old, _, mask = _direct(gen, b=8)
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    rewards = torch.randint(0, 2, (8,), generator=gen).double()
    token_rewards = torch.zeros(logp.shape, dtype=torch.float64)
    token_rewards[:, 0] = rewards
    weighted, _ = compute_dapo_outcome_advantage(token_rewards, mask.double(), {"group_token_mean": True}, uids)
    config = actor_config(agg="seq-mean-token-sum")
    config.global_batch_info["global_batch_size"] = 8
    folded, _ = compute_policy_loss_dapo(
        old_log_prob=old,
        log_prob=logp,
        advantages=weighted,
        response_mask=mask,
        loss_agg_mode="seq-mean-token-sum",
        config=config,
    )
    plain = group_advantages_by_index(rewards, uids)
    loss_mat = clipped_surrogate_loss_matrix(logp, old, plain, mask, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0)
    direct = aggregate_loss(loss_mat, mask, "token_mean_group", group_index=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    torch.testing.assert_close(folded, direct, rtol=1e-12, atol=1e-14)


def _step_metrics_as_verl_aggregates(rollout, minibatches, *, dp_size):
    """ppo_loss per micro-batch, then verl's own reductions: per rank (engine), over ranks (worker), per step."""
    from verl.utils.metric import Metric
    from verl.utils.metric.utils import reduce_metrics
    from verl.utils.py_functional import append_to_dict

    config = actor_config("dapo")
    step: dict = {}
    for ranks in minibatches:
        tokens = int(sum(rollout["response_mask"][rows].sum() for rows_of_rank in ranks for rows in rows_of_rank))
        per_rank = []
        for rows_of_rank in ranks:
            rank: dict = {}
            for rows in rows_of_rank:
                output, td = micro_batch(
                    rollout,
                    rows,
                    dp_size=dp_size,
                    batch_num_tokens=tokens,
                    global_batch_size=sum(len(r) for rr in ranks for r in rr),
                )
                append_to_dict(rank, ppo_loss(config, output, td)[1])  # as forward_backward_batch collects them
            per_rank.append(rank)
        if dp_size == 1:
            merged = per_rank[0]
        else:  # allgather_dict_into_dict, then update_actor's Metric.aggregate_dp
            merged = {key: Metric.aggregate_dp([rank[key] for rank in per_rank]) for key in per_rank[0]}
        append_to_dict(step, merged)
    return reduce_metrics(step)


@pytest.mark.parametrize("dp_size", [1, 2])
def test_clipped_token_probability_is_exact_through_verls_metric_aggregation(gen, dp_size):
    """Micro-batches of unequal size: the ratio of verl's averaged sums and counts is the whole step's mean."""
    from dapo_verl.core import clip_diagnostics
    from dapo_verl.report.derived import derive_ratios

    rollout = random_rollout(gen, batch=12, response_len=8)
    length = rollout["responses"].shape[1]
    logp = rollout["full_logp"].detach()[:, -length - 1 : -1]  # verl's logits predict the next token: shift by one
    rollout["old_log_probs"] = (logp + 0.5 * torch.randn(logp.shape, generator=gen, dtype=logp.dtype)).clamp(max=0)
    sign = torch.tensor([1.0, 1.0, -1.0], dtype=logp.dtype).repeat(4).unsqueeze(1)  # (12, 1): two in three A > 0
    rollout["advantages"] = rollout["advantages"].abs() * sign
    rows = torch.randperm(12, generator=gen)
    split = {
        1: [[[rows[:1], rows[1:5]]], [[rows[5:7], rows[7:]]]],  # 2 mini-batches, 2 micro-batches each
        2: [[[rows[:1], rows[1:3]], [rows[3:4], rows[4:6]]], [[rows[6:7], rows[7:9]], [rows[9:11], rows[11:]]]],
    }
    logged = _step_metrics_as_verl_aggregates(rollout, split[dp_size], dp_size=dp_size)
    whole = clip_diagnostics(
        logp,
        rollout["old_log_probs"],
        rollout["advantages"],
        rollout["response_mask"],
        clip_low=0.2,
        clip_high=0.28,
        clip_ratio_c=3.0,
    )
    assert float(whole["clip_upper_tokens"]) >= 3 and float(whole["clip_higher_kept_tokens"]) >= 1  # non-trivial
    ratios = derive_ratios(logged)
    assert ratios["actor/dapo/clip_upper_old_prob_mean"] == pytest.approx(
        float(whole["clip_upper_old_prob_sum"] / whole["clip_upper_tokens"]), rel=1e-9
    )
    assert ratios["actor/dapo/clip_higher_kept_old_prob_mean"] == pytest.approx(
        float(whole["clip_higher_kept_old_prob_sum"] / whole["clip_higher_kept_tokens"]), rel=1e-9
    )
    assert ratios["actor/dapo/clip_upper_positive_share"] == pytest.approx(
        float(whole["clip_upper_tokens"] / whole["positive_advantage_tokens"]), rel=1e-9
    )
    # verl averages each micro-batch's value: the max is a lower bound of the step's, never above it
    assert 0 < logged["actor/dapo/clip_upper_old_prob_max"] <= float(whole["clip_upper_old_prob_max"]) + 1e-12
