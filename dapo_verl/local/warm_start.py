"""The warm start: a short supervised phase that leaves the correct answer unlikely, before RL begins.

Why (paper §3.1): with the upper clip at 1 + eps_high, a token of probability p can rise to at most about
p (1 + eps_high) per rollout before its gradient is cut, so a token RL must discover -- one the policy
gives little probability -- grows slowly, while an already likely token is barely held back. A randomly
initialised model has no such tokens (every answer starts near 1/V); this phase builds a policy that is
confident in plausible wrong answers and gives the correct one little mass, the situation clip-higher is for.

The target of each training prompt's first answer token is

    q = correct_prob * onehot(answer) + (1 - correct_prob) / D * sum_j onehot(decoy_j)

over the task's D decoy answers (:data:`dapo_verl.local.tasks.DECOYS`; a decoy equal to the answer adds to
it, so the correct answer is likelier on those prompts); the later answer tokens and EOS are taught as they
are (teacher forcing). The loss is the cross-entropy against these targets, averaged over the answer and
EOS positions and over a batch of training prompts (held-out prompts are never seen), minimised by its own
AdamW optimiser for ``local.warm_start.steps`` steps. The phase draws its prompts from a generator seeded by
``data.seed`` and leaves the global RNG as it found it, so RL's sampling does not depend on it.

Shape legend: P prompts, S prompt length, K answer tokens, D decoys per prompt, V vocabulary.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from dapo_verl.local.config import WarmStartConfig
from dapo_verl.local.rollout import encode
from dapo_verl.local.tasks import TaskData, decoy_answers

__all__ = ["warm_start"]

logger = logging.getLogger(__name__)


def _first_token_targets(
    tokenizer: PreTrainedTokenizerFast, task: TaskData, answers: Tensor, correct_prob: float, vocab: int
) -> Tensor:
    """(P, V) target distribution q of the first answer token of every training prompt (module formula)."""
    decoys = encode(tokenizer, ["".join(d[0] for d in row) for row in decoy_answers(task.name, task.train_prompts)])
    targets = torch.zeros(answers.shape[0], vocab)  # (P, V)
    targets.scatter_add_(1, answers[:, :1], torch.full((answers.shape[0], 1), correct_prob))
    share = (1.0 - correct_prob) / decoys.shape[1]
    return targets.scatter_add_(1, decoys, torch.full(decoys.shape, share))  # (P, V); rows sum to 1


def _sequences(tokenizer: PreTrainedTokenizerFast, prompts: list[str], answers: Tensor) -> Tensor:
    """(P, S + K + 1) prompt, answer and EOS token ids."""
    eos = torch.full((answers.shape[0], 1), int(tokenizer.eos_token_id), dtype=torch.int64)
    return torch.cat([encode(tokenizer, prompts), answers, eos], dim=1)


def _loss(model: PreTrainedModel, sequences: Tensor, targets: Tensor, prompt_length: int) -> Tensor:
    """Mean cross-entropy over the answer and EOS positions: soft targets first, then the sequence's tokens."""
    logits = model(input_ids=sequences).logits[:, prompt_length - 1 : -1].float()  # (b, K + 1, V)
    log_probs = torch.log_softmax(logits, dim=-1)
    first = -(targets * log_probs[:, 0]).sum(dim=-1)  # (b,)
    rest = -log_probs[:, 1:].gather(-1, sequences[:, prompt_length + 1 :].unsqueeze(-1)).squeeze(-1)  # (b, K)
    return (first + rest.sum(dim=-1)).mean() / log_probs.shape[1]


@torch.no_grad()
def _held_out_first_token(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, task: TaskData, device: torch.device
) -> dict[str, float]:
    """Mean probability of the correct first answer token on the evaluation prompts, and its entropy."""
    prompts = encode(tokenizer, task.eval_prompts).to(device)  # (P, S)
    answers = encode(tokenizer, task.eval_answers)[:, 0].to(device)  # (P,)
    log_probs = torch.log_softmax(model(input_ids=prompts).logits[:, -1].float(), dim=-1)  # (P, V)
    correct = log_probs.gather(1, answers.unsqueeze(1)).exp()  # (P, 1)
    entropy = -(log_probs.exp() * log_probs).sum(dim=-1)  # (P,)
    return {
        "dapo/warm_start/heldout_correct_prob": correct.mean().item(),
        "dapo/warm_start/heldout_correct_prob_below_0.1": (correct < 0.1).float().mean().item(),
        "dapo/warm_start/heldout_answer_entropy": entropy.mean().item(),
    }


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    task: TaskData,
    cfg: WarmStartConfig,
    *,
    seed: int,
    device: torch.device,
) -> dict[str, float]:
    """Train ``model`` in place on the warm-start targets (module docstring); nothing when ``cfg.steps`` is 0.

    Args:
        model: The policy, on ``device``; left in train mode.
        tokenizer: Its character tokenizer.
        task: The task; only its training prompts are trained on.
        cfg: ``local.warm_start``.
        seed: ``data.seed``; seeds the prompt draws.
        device: Where the model lives.

    Returns:
        ``{}`` when off; else ``dapo/warm_start/loss`` (mean over the last 10% of steps),
        ``dapo/warm_start/heldout_correct_prob`` (mean probability of the correct first answer token on the
        evaluation prompts afterwards), ``dapo/warm_start/heldout_correct_prob_below_0.1`` (share of them
        where it is below 0.1) and ``dapo/warm_start/heldout_answer_entropy`` (entropy of that token, nats).

    Raises:
        ValueError: if the task has no decoy rule (:data:`~dapo_verl.local.tasks.DECOYS`).
    """
    if cfg.steps == 0:
        return {}
    answers = encode(tokenizer, task.train_answers)  # (P, K)
    targets = _first_token_targets(tokenizer, task, answers, cfg.correct_prob, model.config.vocab_size)
    sequences = _sequences(tokenizer, task.train_prompts, answers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    losses = []
    for _ in range(cfg.steps):
        rows = torch.randint(len(task.train_prompts), (cfg.batch_size,), generator=generator)
        loss = _loss(model, sequences[rows].to(device), targets[rows].to(device), task.prompt_length)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.zero_grad(set_to_none=True)
    tail = losses[-max(1, len(losses) // 10) :]
    metrics = {"dapo/warm_start/loss": sum(tail) / len(tail), **_held_out_first_token(model, tokenizer, task, device)}
    logger.info(
        "Warm start: %d supervised steps (correct_prob %g), loss %.3f; held-out correct-answer probability "
        "%.3f (below 0.1 on %.0f%% of prompts), answer entropy %.2f nats.",
        cfg.steps,
        cfg.correct_prob,
        metrics["dapo/warm_start/loss"],
        metrics["dapo/warm_start/heldout_correct_prob"],
        100 * metrics["dapo/warm_start/heldout_correct_prob_below_0.1"],
        metrics["dapo/warm_start/heldout_answer_entropy"],
    )
    return metrics
