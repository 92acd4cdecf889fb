"""The local backend's policy update: DAPO's loss on a filled batch, with verl's batching semantics.

One training step, as in verl's actor:

1. :func:`assemble_batch` turns the sampler's groups into flat tensors; advantages come from
   :func:`~dapo_verl.core.group_advantages_by_index` on the shaped scores; with
   ``algorithm.overlong_filtering`` truncated responses lose their loss mask
   (:func:`~dapo_verl.core.mask_truncated_responses`); with ``algorithm.group_token_mean`` the advantages
   are weighted by :func:`~dapo_verl.core.group_token_mean_weights` (paired with ``seq-mean-token-sum``).
2. :func:`update_policy` recomputes the old log-probs with the current policy (a forward pass, as verl
   does), then takes one AdamW step per mini-batch of ``ppo_mini_batch_size`` groups, ``ppo_epochs``
   times, so clip-higher can act. Each mini-batch's loss is
   :func:`~dapo_verl.core.clipped_surrogate_with_diagnostics` reduced by :func:`~dapo_verl.core.aggregate_loss`
   with the mini-batch's global token and sequence counts, so splitting it into micro-batches of
   ``ppo_micro_batch_size_per_gpu`` responses (gradient accumulation) leaves the gradient unchanged.

Shape legend: P groups, G responses per group, B = P*G responses, S prompt length, L response budget,
V vocabulary.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from transformers import PreTrainedModel

from dapo_verl.config import DapoConfig
from dapo_verl.core import (
    aggregate_loss,
    clipped_surrogate_with_diagnostics,
    group_advantages_by_index,
    group_token_mean_weights,
    mask_truncated_responses,
    truncated_importance_weights,
)
from dapo_verl.local.config import ActorConfig, RolloutCorrectionConfig
from dapo_verl.report.derived import derive_ratios
from dapo_verl.sampler import GroupResult

__all__ = ["TrainBatch", "assemble_batch", "batch_metrics", "sequence_log_probs", "update_policy"]

logger = logging.getLogger(__name__)

_CLIP_KEYS = (
    "clip_upper_fraction",
    "clip_lower_fraction",
    "dual_clip_fraction",
    "clip_higher_kept_fraction",
    "ratio_mean",
)
_PART_KEYS = (
    "positive_advantage_tokens",
    "clip_upper_tokens",
    "clip_upper_old_prob_sum",
    "clip_higher_kept_tokens",
    "clip_higher_kept_old_prob_sum",
)
"""Counts and sums of the core's diagnostics, logged as verl logs them: the mean over loss calls."""
_MAX_KEYS = ("clip_upper_old_prob_max", "clip_higher_kept_old_prob_max")


@dataclass
class TrainBatch:
    """A filled batch as flat tensors.

    Attributes:
        input_ids: (B, S + L) int64 prompt followed by the padded response.
        mask: (B, L) bool loss mask (after overlong filtering).
        advantages: (B,) float32, already weighted when ``group_token_mean`` is on.
        scores: (B,) float32 shaped rewards; acc: (B,) bool raw correctness.
        lengths: (B,) int64 response lengths; truncated: (B,) bool.
        group_index: (B,) int64 group of each row; group_size: G.
        rollout_logp: (B, L) float32 log-probs of the response tokens under the weights that sampled them, when the
            rollout kept them (``algorithm.rollout_correction``); None otherwise.
    """

    input_ids: Tensor
    mask: Tensor
    advantages: Tensor
    scores: Tensor
    acc: Tensor
    lengths: Tensor
    truncated: Tensor
    group_index: Tensor
    group_size: int
    rollout_logp: Tensor | None = None

    @property
    def prompt_length(self) -> int:
        """S, prompt tokens before the response."""
        return self.input_ids.shape[1] - self.mask.shape[1]


def assemble_batch(groups: Sequence[GroupResult], prompts: Tensor, dapo: DapoConfig) -> TrainBatch:
    """Flatten groups and compute their advantages and loss mask.

    Args:
        groups: The sampler's batch (P groups of G responses, ``payload`` from :class:`~.rollout.Rollout`).
        prompts: (P, S) int64 prompt tokens of the groups, in order.
        dapo: Advantage and overlong settings.
    """
    size = groups[0].group_size
    tokens = torch.cat([g.payload["tokens"] for g in groups])  # (B, L)
    mask = torch.cat([g.payload["mask"] for g in groups])  # (B, L)
    if any(g.scores is None for g in groups):
        raise ValueError(
            "Every group needs scores (the shaped rewards) to compute advantages; the generate "
            "callback must fill GroupResult.scores."
        )
    scores = torch.cat([g.scores for g in groups if g.scores is not None]).to(torch.float32)  # (B,)
    truncated = torch.cat([g.truncated for g in groups])  # (B,)
    index = torch.arange(len(groups)).repeat_interleave(size)  # (B,)
    if dapo.overlong.overlong_filtering:
        mask = mask_truncated_responses(mask, truncated)
    advantages = group_advantages_by_index(
        scores, index, scale_by_std=dapo.advantage.norm_adv_by_std_in_grpo, eps=dapo.advantage.adv_epsilon
    )
    if dapo.advantage.group_token_mean:
        advantages = advantages * group_token_mean_weights(mask, index, dtype=advantages.dtype)
    return TrainBatch(
        input_ids=torch.cat([prompts.repeat_interleave(size, dim=0), tokens], dim=1),  # (B, S + L)
        mask=mask,
        advantages=advantages,
        scores=scores,
        acc=torch.cat([g.metric for g in groups]).bool(),
        lengths=torch.cat([g.response_lengths for g in groups]),
        truncated=truncated,
        group_index=index,
        group_size=size,
        rollout_logp=(
            torch.cat([g.payload["rollout_logp"] for g in groups])
            if all("rollout_logp" in g.payload for g in groups)
            else None
        ),
    )


def sequence_log_probs(
    model: PreTrainedModel,
    input_ids: Tensor,
    prompt_length: int,
    temperature: float,
) -> tuple[Tensor, Tensor]:
    """Log-probs and entropies of the response tokens under ``model`` at ``temperature``.

    Args:
        model: The policy.
        input_ids: (B, S + L) int64 prompt + response tokens (right padding only, so no attention mask).
        prompt_length: S.
        temperature: Logits are divided by it, as at sampling time (verl does the same).

    Returns:
        ``(logp, entropy)``, each (B, L) float32.
    """
    logits = model(input_ids=input_ids).logits[:, prompt_length - 1 : -1].float() / temperature  # (B, L, V)
    log_probs = torch.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, input_ids[:, prompt_length:].unsqueeze(-1)).squeeze(-1)  # (B, L)
    entropy = -(log_probs.exp() * log_probs).sum(dim=-1)  # (B, L)
    return logp, entropy


def _chunks(start: int, stop: int, size: int | None) -> list[slice]:
    step = size or (stop - start)
    return [slice(i, min(i + step, stop)) for i in range(start, stop, step)]


class _StepMetrics:
    """Token-weighted accumulation of the per-micro-batch diagnostics over one training step."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.calls = 0
        self.sums = dict.fromkeys((*_CLIP_KEYS, "entropy"), 0.0)
        self.parts = dict.fromkeys(_PART_KEYS, 0.0)
        self.maxima = dict.fromkeys(_MAX_KEYS, 0.0)
        self.ratio_min, self.ratio_max = math.inf, -math.inf
        self.losses: list[float] = []
        self.grad_norms: list[float] = []

    def add_micro(self, diag: dict[str, Tensor], entropy_sum: float, tokens: int) -> None:
        for key in _CLIP_KEYS:
            self.sums[key] += float(diag[key]) * tokens
        self.sums["entropy"] += entropy_sum
        self.tokens += tokens
        self.calls += 1
        for key in _PART_KEYS:
            self.parts[key] += float(diag[key])
        for key in _MAX_KEYS:
            self.maxima[key] = max(self.maxima[key], float(diag[key]))
        if tokens:
            self.ratio_min = min(self.ratio_min, float(diag["ratio_min"]))
            self.ratio_max = max(self.ratio_max, float(diag["ratio_max"]))

    def result(self) -> dict[str, float]:
        # Per-token statistics of a step without a loss token (e.g. every response truncated under overlong
        # filtering) are undefined: NaN, logged as null, so run averages skip the step instead of counting 0.
        tokens = self.tokens if self.tokens > 0 else math.nan
        frac = {key: self.sums[key] / tokens for key in _CLIP_KEYS}
        has_tokens = self.tokens > 0
        return {
            "actor/pg_loss": sum(self.losses) / max(len(self.losses), 1),
            "actor/pg_clipfrac": frac["clip_upper_fraction"] + frac["clip_lower_fraction"],
            "actor/entropy": self.sums["entropy"] / tokens,
            "actor/grad_norm": sum(self.grad_norms) / max(len(self.grad_norms), 1),
            **{f"actor/dapo/{key}": value for key, value in frac.items()},
            "actor/dapo/ratio_min": self.ratio_min if has_tokens else math.nan,
            "actor/dapo/ratio_max": self.ratio_max if has_tokens else math.nan,
            "actor/dapo/gradient_steps": float(len(self.grad_norms)),
            **self._clipped_probabilities(),
        }

    def _clipped_probabilities(self) -> dict[str, float]:
        """The counts and sums as verl logs them (mean per loss call), the exact step maxima, and their ratios."""
        calls = self.calls if self.calls else math.nan
        parts = {f"actor/dapo/{key}": value / calls for key, value in self.parts.items()}
        maxima = {f"actor/dapo/{key}": value for key, value in self.maxima.items()}
        return parts | maxima | derive_ratios(parts)


def update_policy(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    dapo: DapoConfig,
    actor: ActorConfig,
    *,
    temperature: float,
    correction: RolloutCorrectionConfig | None = None,
) -> dict[str, float]:
    """Recompute old log-probs, then take one optimiser step per mini-batch and epoch.

    Args:
        model: The policy, updated in place.
        optimizer: Its optimiser.
        batch: From :func:`assemble_batch`.
        dapo: Loss settings (clip ratios, dual clip, aggregation).
        actor: Batching, gradient clipping and entropy bonus.
        temperature: Rollout temperature (logits are scaled by it).
        correction: With ``rollout_is=token``, each token's loss term is multiplied by its truncated importance
            weight against the sampling policy (:func:`~dapo_verl.core.truncated_importance_weights`, as verl's
            ``dapo`` loss multiplies by ``rollout_is_weights``); the batch must carry ``rollout_logp``.

    Returns:
        ``actor/pg_loss`` (mean over gradient steps), ``actor/pg_clipfrac``, ``actor/entropy``,
        ``actor/grad_norm`` (mean over gradient steps), ``actor/dapo/{clip_upper_fraction,
        clip_lower_fraction, dual_clip_fraction, clip_higher_kept_fraction, ratio_mean, ratio_min,
        ratio_max, gradient_steps}``; fractions are over every valid token seen in the step. When the batch
        has no valid token, ``actor/entropy``, the clip fractions and the ratio statistics are NaN (undefined).
        The clipped tokens' old-policy probabilities (:func:`~dapo_verl.core.clip_diagnostics`):
        ``actor/dapo/{positive_advantage_tokens, clip_upper_tokens, clip_upper_old_prob_sum,
        clip_higher_kept_tokens, clip_higher_kept_old_prob_sum}`` as the mean per loss call (micro-batch), as
        verl logs them; ``actor/dapo/{clip_upper_old_prob_max, clip_higher_kept_old_prob_max}`` over the step
        (0 when no token was clipped); and their ratios (:data:`~dapo_verl.report.derived.RATIO_METRICS`):
        ``actor/dapo/{clip_upper_old_prob_mean, clip_higher_kept_old_prob_mean, clip_upper_positive_share}``,
        NaN (logged as null) in a step where their count is 0. With the correction, verl's
        ``rollout_corr/rollout_is_{mean,max,min}`` (over response tokens, after truncation) and
        ``rollout_corr/rollout_is_truncated_fraction`` (tokens whose weight hit the threshold).
    """
    rows = batch.mask.shape[0]
    micro = actor.ppo_micro_batch_size_per_gpu
    with torch.no_grad():
        old_logp = torch.cat(
            [
                sequence_log_probs(model, batch.input_ids[part], batch.prompt_length, temperature)[0]
                for part in _chunks(0, rows, micro)
            ]
        )  # (B, L)
    weights, correction_metrics = _importance_weights(batch, old_logp, correction)
    stats = _StepMetrics()
    for _ in range(actor.ppo_epochs):
        for mini in _chunks(0, rows, actor.ppo_mini_batch_size * batch.group_size):
            _mini_batch_step(model, optimizer, batch, old_logp, weights, mini, dapo, actor, temperature, stats)
    return stats.result() | correction_metrics


def _importance_weights(
    batch: TrainBatch,
    old_logp: Tensor,
    correction: RolloutCorrectionConfig | None,
) -> tuple[Tensor | None, dict[str, float]]:
    """(B, L) truncated importance weights and their metrics, or (None, {}) without ``rollout_is``."""
    if correction is None or correction.rollout_is is None:
        return None, {}
    if batch.rollout_logp is None:
        raise ValueError(
            "algorithm.rollout_correction.rollout_is=token needs the log-probs of the sampling policy, "
            "but the batch has none: the rollout must keep them (Rollout(keep_log_probs=True))."
        )
    threshold = correction.rollout_is_threshold
    weights = truncated_importance_weights(
        old_logp, batch.rollout_logp.to(old_logp.device), batch.mask, threshold=threshold
    )  # (B, L)
    valid = weights[batch.mask]
    if valid.numel() == 0:
        return weights, {}
    return weights, {
        "rollout_corr/rollout_is_mean": valid.mean().item(),
        "rollout_corr/rollout_is_max": valid.max().item(),
        "rollout_corr/rollout_is_min": valid.min().item(),
        "rollout_corr/rollout_is_truncated_fraction": (valid >= threshold).float().mean().item(),
    }


def _mini_batch_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: TrainBatch,
    old_logp: Tensor,
    weights: Tensor | None,
    mini: slice,
    dapo: DapoConfig,
    actor: ActorConfig,
    temperature: float,
    stats: _StepMetrics,
) -> None:
    """One optimiser step on rows ``mini``, accumulating gradients over micro-batches."""
    clip = {
        "clip_low": dapo.loss.clip_ratio_low,
        "clip_high": dapo.loss.clip_ratio_high,
        "clip_ratio_c": dapo.loss.clip_ratio_c,
    }
    counts = {"num_valid_tokens": int(batch.mask[mini].sum()), "num_sequences": mini.stop - mini.start}
    mode = dapo.loss.aggregation
    optimizer.zero_grad(set_to_none=True)
    pg_loss = 0.0
    for part in _chunks(mini.start, mini.stop, actor.ppo_micro_batch_size_per_gpu):
        logp, entropy = sequence_log_probs(model, batch.input_ids[part], batch.prompt_length, temperature)
        mask, advantages = batch.mask[part], batch.advantages[part]
        loss_mat, diag = clipped_surrogate_with_diagnostics(logp, old_logp[part], advantages, mask, **clip)  # (b, L)
        if weights is not None:  # rollout correction: as verl's dapo loss multiplies by rollout_is_weights
            loss_mat = loss_mat * weights[part]
        pg = aggregate_loss(loss_mat, mask, mode, **counts)
        loss = pg
        if actor.entropy_coeff:
            loss = pg - actor.entropy_coeff * aggregate_loss(entropy, mask, mode, **counts)
        loss.backward()
        pg_loss += float(pg.detach())
        stats.add_micro(diag, float(torch.where(mask, entropy.detach(), 0.0).sum()), int(mask.sum()))
    params = [p for p in model.parameters() if p.grad is not None]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, actor.grad_clip))
    if math.isfinite(grad_norm):
        optimizer.step()
    else:  # as verl: a non-finite gradient skips the step instead of corrupting the weights
        logger.warning("Non-finite gradient norm %s; skipping this optimiser step.", grad_norm)
    stats.losses.append(pg_loss)
    stats.grad_norms.append(grad_norm)


def batch_metrics(batch: TrainBatch) -> dict[str, float]:
    """Metrics of the trained batch under verl's names where verl has one.

    Returns:
        ``critic/score/mean`` (shaped reward), ``critic/advantages/mean``, ``response_length/mean``,
        ``response_length/clip_ratio`` (share truncated), ``actor/dapo/train_acc`` (raw correctness of the
        trained responses), ``actor/dapo/uninformative_groups`` (trained groups whose correctness does not
        vary; 0 whenever dynamic sampling is on), ``actor/dapo/loss_tokens``.
    """
    acc = batch.acc.view(-1, batch.group_size).float()  # (P, G)
    uninformative = (acc.amax(dim=1) == acc.amin(dim=1)).sum()
    return {
        "critic/score/mean": batch.scores.mean().item(),
        "critic/advantages/mean": batch.advantages.mean().item(),
        "response_length/mean": batch.lengths.float().mean().item(),
        "response_length/clip_ratio": batch.truncated.float().mean().item(),
        "actor/dapo/train_acc": acc.mean().item(),
        "actor/dapo/uninformative_groups": float(uninformative),
        "actor/dapo/loss_tokens": float(batch.mask.sum()),
    }
