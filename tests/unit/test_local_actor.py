"""The local policy update: exact token-mean under gradient accumulation, overlong filtering, metrics."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from dapo_verl.config import AdvantageConfig, DapoConfig, LossConfig, OverlongConfig
from dapo_verl.core import group_token_mean_weights
from dapo_verl.local.actor import assemble_batch, batch_metrics, sequence_log_probs, update_policy
from dapo_verl.local.config import ActorConfig, ModelConfig, RolloutCorrectionConfig
from dapo_verl.local.model import load_or_build
from dapo_verl.sampler import GroupResult

EOS, G, L, S = 1, 4, 5, 4


def _groups(gen, num_groups=4):
    groups = []
    for p in range(num_groups):
        tokens = torch.randint(3, 17, (G, L), generator=gen)
        lengths = torch.randint(1, L + 1, (G,), generator=gen)
        mask = torch.arange(L) < lengths.unsqueeze(1)
        eos_at = lengths < L
        tokens[eos_at, lengths[eos_at] - 1] = EOS
        acc = torch.tensor([True, False, True, False]) if p % 2 == 0 else torch.tensor([True, True, False, False])
        groups.append(
            GroupResult(
                prompt_id=p,
                metric=acc,
                response_lengths=lengths,
                truncated=~eos_at,
                scores=acc.float() * 2 - 1 - 0.1 * lengths,
                payload={"tokens": torch.where(mask, tokens, 0), "mask": mask},
            )
        )
    return groups


@pytest.fixture
def model(tmp_path):
    built, *_ = load_or_build(
        ModelConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2),
        max_positions=S + L,
        seed=0,
        cache_dir=tmp_path,
    )
    return built


def _update(model, batch, dapo, actor):
    model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    metrics = update_policy(model, optimizer, batch, dapo, actor, temperature=1.0)
    return model, metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batching_leaves_the_update_unchanged(model, gen, agg):
    dapo = DapoConfig(loss=LossConfig(loss_agg_mode=agg))
    batch = assemble_batch(_groups(gen), torch.randint(3, 17, (4, S), generator=gen), dapo)
    whole, m1 = _update(model, batch, dapo, ActorConfig(ppo_mini_batch_size=2, ppo_epochs=2))
    split, m2 = _update(
        model, batch, dapo, ActorConfig(ppo_mini_batch_size=2, ppo_epochs=2, ppo_micro_batch_size_per_gpu=3)
    )
    for (name, a), (_, b) in zip(whole.named_parameters(), split.named_parameters()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    assert m1["actor/pg_loss"] == pytest.approx(m2["actor/pg_loss"], abs=1e-6)
    assert m1["actor/dapo/gradient_steps"] == 4.0


def test_later_gradient_steps_move_the_ratio_away_from_one(model, gen):
    dapo = DapoConfig()
    batch = assemble_batch(_groups(gen), torch.randint(3, 17, (4, S), generator=gen), dapo)
    _, metrics = _update(model, batch, dapo, ActorConfig(ppo_mini_batch_size=1, ppo_epochs=3))
    assert metrics["actor/dapo/ratio_max"] > 1.0 > metrics["actor/dapo/ratio_min"]
    assert metrics["actor/pg_clipfrac"] == pytest.approx(
        metrics["actor/dapo/clip_upper_fraction"] + metrics["actor/dapo/clip_lower_fraction"]
    )
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


def test_overlong_filtering_removes_truncated_responses_from_the_loss(gen):
    groups = _groups(gen)
    prompts = torch.zeros(4, S, dtype=torch.int64)
    kept = assemble_batch(groups, prompts, DapoConfig())
    filtered = assemble_batch(groups, prompts, DapoConfig(overlong=OverlongConfig(overlong_filtering=True)))
    assert kept.truncated.any()
    assert not filtered.mask[filtered.truncated].any()
    assert torch.equal(filtered.mask[~filtered.truncated], kept.mask[~kept.truncated])


def test_group_token_mean_weights_the_advantages(gen):
    groups = _groups(gen)
    prompts = torch.zeros(4, S, dtype=torch.int64)
    plain = assemble_batch(groups, prompts, DapoConfig(loss=LossConfig(loss_agg_mode="seq-mean-token-sum")))
    weighted = assemble_batch(
        groups,
        prompts,
        DapoConfig(
            loss=LossConfig(loss_agg_mode="seq-mean-token-sum"), advantage=AdvantageConfig(group_token_mean=True)
        ),
    )
    weights = group_token_mean_weights(plain.mask, plain.group_index)
    assert torch.allclose(weighted.advantages, plain.advantages * weights)


def test_batch_metrics_count_uninformative_groups(gen):
    groups = _groups(gen)
    old = groups[1]
    groups[1] = GroupResult(
        prompt_id=1,
        metric=torch.ones(G, dtype=torch.bool),
        response_lengths=old.response_lengths,
        truncated=old.truncated,
        scores=old.scores,
        payload=old.payload,
    )
    metrics = batch_metrics(assemble_batch(groups, torch.zeros(4, S, dtype=torch.int64), DapoConfig()))
    assert metrics["actor/dapo/uninformative_groups"] == 1.0
    assert 0.0 <= metrics["response_length/clip_ratio"] <= 1.0


def test_per_token_metrics_are_undefined_when_no_token_is_trained(model, gen):
    groups = _groups(gen)
    groups = [
        GroupResult(
            prompt_id=g.prompt_id,
            metric=g.metric,
            response_lengths=g.response_lengths,
            truncated=torch.ones(G, dtype=torch.bool),
            scores=g.scores,
            payload=g.payload,
        )
        for g in groups
    ]
    dapo = DapoConfig(overlong=OverlongConfig(overlong_filtering=True))
    batch = assemble_batch(groups, torch.randint(3, 17, (4, S), generator=gen), dapo)
    assert not batch.mask.any()
    _, metrics = _update(model, batch, dapo, ActorConfig(ppo_mini_batch_size=2))
    undefined = [
        "actor/entropy",
        "actor/pg_clipfrac",
        "actor/dapo/clip_upper_fraction",
        "actor/dapo/ratio_mean",
        "actor/dapo/ratio_min",
        "actor/dapo/ratio_max",
    ]
    assert all(math.isnan(metrics[key]) for key in undefined), {k: metrics[k] for k in undefined}
    assert metrics["actor/pg_loss"] == 0.0
    assert metrics["actor/dapo/gradient_steps"] == 2.0


def test_clipped_token_probabilities_do_not_depend_on_micro_batching(model, gen):
    dapo = DapoConfig()
    batch = assemble_batch(_groups(gen), torch.randint(3, 17, (4, S), generator=gen), dapo)
    actor = ActorConfig(ppo_mini_batch_size=1, ppo_epochs=3)
    _, whole = _update(model, batch, dapo, actor)
    _, split = _update(
        model, batch, dapo, ActorConfig(ppo_mini_batch_size=1, ppo_epochs=3, ppo_micro_batch_size_per_gpu=1)
    )
    assert whole["actor/dapo/clip_upper_tokens"] > 0  # the later gradient steps clip
    for key in (
        "clip_upper_old_prob_mean",
        "clip_upper_positive_share",
        "clip_upper_old_prob_max",
        "clip_higher_kept_old_prob_max",
    ):
        assert split[f"actor/dapo/{key}"] == pytest.approx(whole[f"actor/dapo/{key}"], rel=1e-5), key
    # the parts are the mean per loss call, as verl logs them: 4 calls per gradient step instead of 1
    assert split["actor/dapo/clip_upper_tokens"] == pytest.approx(whole["actor/dapo/clip_upper_tokens"] / G)
    assert whole["actor/dapo/clip_upper_old_prob_mean"] == pytest.approx(
        whole["actor/dapo/clip_upper_old_prob_sum"] / whole["actor/dapo/clip_upper_tokens"]
    )
    assert 0 < whole["actor/dapo/clip_upper_old_prob_mean"] <= whole["actor/dapo/clip_upper_old_prob_max"] <= 1


def test_clipped_token_probabilities_without_tokens_are_zero_counts_and_undefined_means(model, gen):
    groups = [
        GroupResult(
            prompt_id=g.prompt_id,
            metric=g.metric,
            response_lengths=g.response_lengths,
            truncated=torch.ones(G, dtype=torch.bool),
            scores=g.scores,
            payload=g.payload,
        )
        for g in _groups(gen)
    ]
    dapo = DapoConfig(overlong=OverlongConfig(overlong_filtering=True))
    _, metrics = _update(
        model,
        assemble_batch(groups, torch.randint(3, 17, (4, S), generator=gen), dapo),
        dapo,
        ActorConfig(ppo_mini_batch_size=2),
    )
    assert metrics["actor/dapo/clip_upper_tokens"] == metrics["actor/dapo/positive_advantage_tokens"] == 0.0
    assert metrics["actor/dapo/clip_upper_old_prob_max"] == 0.0
    assert all(
        math.isnan(metrics[f"actor/dapo/{key}"])
        for key in ("clip_upper_old_prob_mean", "clip_higher_kept_old_prob_mean", "clip_upper_positive_share")
    )


def _with_rollout_logp(groups, logp):
    for g, rows in zip(groups, logp.split(G)):
        g.payload["rollout_logp"] = rows
    return groups


def test_rollout_correction_leaves_responses_of_the_current_policy_alone_and_reweighs_older_ones(model, gen):
    dapo, actor = DapoConfig(), ActorConfig(ppo_mini_batch_size=2)
    correction = RolloutCorrectionConfig(rollout_is="token", rollout_is_threshold=2.0)
    groups, prompts = _groups(gen), torch.randint(3, 17, (4, S), generator=gen)
    plain = assemble_batch(groups, prompts, dapo)
    with torch.no_grad():
        current = sequence_log_probs(model, plain.input_ids, plain.prompt_length, 1.0)[0]  # (B, L)

    def update(batch, correction):
        updated = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(updated.parameters(), lr=1e-2, weight_decay=0.0)
        return updated, update_policy(updated, optimizer, batch, dapo, actor, temperature=1.0, correction=correction)

    baseline, _ = update(plain, None)
    same, metrics = update(assemble_batch(_with_rollout_logp(groups, current), prompts, dapo), correction)
    for (name, a), (_, b) in zip(baseline.named_parameters(), same.named_parameters()):
        assert torch.equal(a, b), name  # sampled by these very weights: every weight is exactly 1
    assert metrics["rollout_corr/rollout_is_mean"] == metrics["rollout_corr/rollout_is_max"] == 1.0
    older = current + 0.8 * torch.randn(current.shape, generator=gen)  # as if an earlier policy had sampled them
    moved, metrics = update(assemble_batch(_with_rollout_logp(groups, older), prompts, dapo), correction)
    assert any(not torch.equal(a, b) for a, b in zip(baseline.parameters(), moved.parameters()))
    assert metrics["rollout_corr/rollout_is_max"] <= 2.0 and metrics["rollout_corr/rollout_is_min"] < 1.0
    assert 0 < metrics["rollout_corr/rollout_is_truncated_fraction"] < 1


def test_rollout_correction_without_the_sampling_log_probs_is_an_error(model, gen):
    dapo = DapoConfig()
    batch = assemble_batch(_groups(gen), torch.randint(3, 17, (4, S), generator=gen), dapo)
    assert batch.rollout_logp is None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(ValueError, match="rollout_is=token needs the log-probs of the sampling policy"):
        update_policy(
            model,
            optimizer,
            batch,
            dapo,
            ActorConfig(),
            temperature=1.0,
            correction=RolloutCorrectionConfig(rollout_is="token"),
        )
