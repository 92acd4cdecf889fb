"""Rollouts for the local backend: Hugging Face ``generate``, the rule verifier and DAPO's reward shaping.

:class:`Rollout` is the ``generate`` callback of :class:`~dapo_verl.sampler.BatchReplenisher`: for a list
of prompt ids it samples G responses each, scores them and returns one
:class:`~dapo_verl.sampler.GroupResult` per prompt. The filter metric is the verifier's raw correctness
(``acc``); the score is the paper's outcome reward (+1 correct, -1 wrong, §2.3) plus the soft overlong
punishment (:func:`~dapo_verl.core.reward_overlong_penalty`, §3.4) when it is on. The same object runs
greedy evaluation on the held-out prompts and, with ``val_n`` > 1, samples ``val_n`` responses per held-out
prompt for pass@k (:func:`~dapo_verl.core.pass_at_k`), seeded by ``(data.seed, step)`` inside a forked RNG, so
that evaluating never changes the training run and a resumed run evaluates as the uninterrupted one.

A response runs up to and including its first EOS token; without one it fills the whole budget
``data.max_response_length`` and counts as truncated (:func:`~dapo_verl.core.truncated_response_mask`).

Shape legend: P prompts, G responses per prompt, N = P*G responses, S prompt length, L response budget,
K answer length.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerFast

from dapo_verl.config import OverlongConfig
from dapo_verl.core import pass_at_k, pass_at_k_sizes, reward_overlong_penalty, truncated_response_mask
from dapo_verl.local.actor import sequence_log_probs
from dapo_verl.local.tasks import TaskData, verify
from dapo_verl.sampler import GroupResult

__all__ = ["Responses", "Rollout", "encode"]

CORRECT_REWARD, WRONG_REWARD = 1.0, -1.0
"""The paper's rule-based outcome reward (§2.3, Eq. 1)."""


def encode(tokenizer: PreTrainedTokenizerFast, texts: Sequence[str]) -> Tensor:
    """(len(texts), S) int64 token ids of equal-length texts (no special tokens, no padding)."""
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.int64)


class Responses:
    """Generated responses with their masks, lengths, truncation flags and the verifier's verdict.

    Attributes:
        tokens: (N, L) int64, padded with the pad id after each response's end.
        mask: (N, L) bool, True up to and including the first EOS.
        lengths: (N,) int64 valid tokens; truncated: (N,) bool; acc, exact: (N,) bool; scores: (N,) float32.
    """

    def __init__(
        self, tokens: Tensor, answers: Tensor, *, eos_id: int, pad_id: int, budget: int, overlong: OverlongConfig
    ) -> None:
        is_eos = tokens == eos_id  # (N, L)
        before_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) == 0  # nothing but this token ended it yet
        self.mask = before_eos
        self.tokens = torch.where(before_eos, tokens, torch.full_like(tokens, pad_id))
        self.lengths = before_eos.sum(dim=1)
        self.truncated = truncated_response_mask(self.lengths, budget, eos_emitted=is_eos.any(dim=1))
        verdict = verify(self.tokens, answers, eos_id)
        self.acc, self.exact = verdict.acc, verdict.exact
        scores = torch.where(self.acc, CORRECT_REWARD, WRONG_REWARD).to(torch.float32)
        if overlong.overlong_reward_penalty:
            scores = reward_overlong_penalty(
                scores,
                self.lengths,
                budget,
                overlong.overlong_tokens,
                overlong.overlong_penalty_factor,
                schedule=overlong.overlong_schedule,
            )
        self.scores = scores


class Rollout:
    """Sampling, scoring and greedy evaluation with one model.

    Args:
        model: The policy (its train/eval mode is restored after each call).
        tokenizer: Its character tokenizer.
        task: Prompts and answers.
        n: G, responses per prompt (``actor_rollout_ref.rollout.n``).
        temperature: Sampling temperature (``actor_rollout_ref.rollout.temperature``).
        max_response_length: L, the response budget (``data.max_response_length``).
        overlong: Soft overlong punishment settings.
        device: Where the model lives.
        val_n: Sampled responses per held-out prompt for pass@k (``actor_rollout_ref.rollout.val_kwargs.n``);
            1 evaluates greedily only.
        seed: ``data.seed``; with the step, it seeds the sampled evaluation.
        keep_log_probs: Keep each sampled token's log-prob under the weights that sampled it in the group's payload
            (``rollout_logp``, (G, L)), for ``algorithm.rollout_correction``; one more forward pass per round.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerFast,
        task: TaskData,
        *,
        n: int,
        temperature: float,
        max_response_length: int,
        overlong: OverlongConfig,
        device: torch.device,
        val_n: int = 1,
        seed: int = 0,
        keep_log_probs: bool = False,
    ) -> None:
        self.model, self.task, self.n, self.device = model, task, n, device
        self.temperature, self.keep_log_probs = temperature, keep_log_probs
        self.val_n, self.seed = val_n, seed
        self.budget, self.overlong = max_response_length, overlong
        self.eos_id, self.pad_id = int(tokenizer.eos_token_id), int(tokenizer.pad_token_id)
        self.train_prompts = encode(tokenizer, task.train_prompts)  # (P_train, S)
        self.train_answers = encode(tokenizer, task.train_answers)  # (P_train, K)
        self.eval_prompts = encode(tokenizer, task.eval_prompts)
        self.eval_answers = encode(tokenizer, task.eval_answers)
        common = {
            "max_new_tokens": max_response_length,
            "eos_token_id": self.eos_id,
            "pad_token_id": self.pad_id,
            "top_k": None,
            "top_p": None,
            "use_cache": True,
        }
        self.sampling = GenerationConfig(do_sample=True, temperature=temperature, **common)
        self.greedy = GenerationConfig(do_sample=False, **common)
        self.generated_tokens = 0

    def __call__(self, prompt_ids: Sequence[int]) -> list[GroupResult]:
        """Sample and score G responses for each prompt (the sampler's ``generate`` callback)."""
        index = torch.as_tensor(list(prompt_ids), dtype=torch.int64)
        prompts = self.train_prompts[index].repeat_interleave(self.n, dim=0)  # (N, S)
        answers = self.train_answers[index].repeat_interleave(self.n, dim=0)  # (N, K)
        out = self._respond(prompts, answers, self.sampling)
        self.generated_tokens += int(out.lengths.sum())
        sampled_logp = self._sampling_log_probs(prompts, out.tokens) if self.keep_log_probs else None  # (N, L)
        groups = []
        for p, prompt_id in enumerate(index.tolist()):
            rows = slice(p * self.n, (p + 1) * self.n)
            payload = {"tokens": out.tokens[rows], "mask": out.mask[rows], "exact": out.exact[rows]}
            if sampled_logp is not None:
                payload["rollout_logp"] = sampled_logp[rows]
            groups.append(
                GroupResult(
                    prompt_id=prompt_id,
                    metric=out.acc[rows],
                    response_lengths=out.lengths[rows],
                    truncated=out.truncated[rows],
                    scores=out.scores[rows],
                    payload=payload,
                )
            )
        return groups

    @contextmanager
    def eval_mode(self) -> Iterator[None]:
        """The model in eval mode for the block, its train/eval mode restored afterwards (also on an error)."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)

    @torch.no_grad()
    def _sampling_log_probs(self, prompts: Tensor, tokens: Tensor) -> Tensor:
        """(N, L) log-probs of the sampled tokens under the weights that sampled them, at the sampling temperature
        (the rollout policy of ``algorithm.rollout_correction``; sampling uses neither top-k nor top-p)."""
        with self.eval_mode():
            ids = torch.cat([prompts, tokens], dim=1).to(self.device)
            return sequence_log_probs(self.model, ids, prompts.shape[1], self.temperature)[0].cpu()

    def evaluate(self, step: int = 0) -> dict[str, float]:
        """Greedy decoding on the evaluation prompts (and sampling, with ``val_n`` > 1), under verl's names.

        Args:
            step: The training step evaluated; seeds the sampled responses with ``data.seed``.

        Returns:
            ``val-core/<task>/acc/mean@1`` (greedy: correct answer), ``val-aux/<task>/exact/mean@1`` (answer
            then EOS), ``val-aux/<task>/score/mean@1`` (shaped reward), ``val-aux/<task>/response_length/mean``;
            with ``val_n`` > 1 also the sampled accuracy ``val-aux/<task>/acc/mean@<val_n>`` (= pass@1) and
            pass@k as verl names it: ``val-aux/<task>/acc/best@<k>/mean`` for k = 2, 4, ... below ``val_n`` and
            ``val-core/<task>/acc/best@<val_n>/mean``.
        """
        out = self._respond(self.eval_prompts, self.eval_answers, self.greedy)
        name = self.task.name
        metrics = {
            f"val-core/{name}/acc/mean@1": out.acc.float().mean().item(),
            f"val-aux/{name}/exact/mean@1": out.exact.float().mean().item(),
            f"val-aux/{name}/score/mean@1": out.scores.mean().item(),
            f"val-aux/{name}/response_length/mean": out.lengths.float().mean().item(),
        }
        return metrics | self._pass_at_k(step) if self.val_n > 1 else metrics

    def _pass_at_k(self, step: int) -> dict[str, float]:
        """pass@k of ``val_n`` sampled responses per evaluation prompt, in an RNG forked from training's."""
        n, name = self.val_n, self.task.name
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(self.seed * 1_000_003 + step)
            out = self._respond(
                self.eval_prompts.repeat_interleave(n, dim=0),
                self.eval_answers.repeat_interleave(n, dim=0),
                self.sampling,
            )
        correct = out.acc.view(-1, n)  # (P, n)
        metrics = {f"val-aux/{name}/acc/mean@{n}": correct.float().mean().item()}
        for k in pass_at_k_sizes(n):
            section = "val-core" if k == n else "val-aux"  # verl's placement of best@k
            metrics[f"{section}/{name}/acc/best@{k}/mean"] = pass_at_k(correct, k).mean().item()
        return metrics

    def prompt_tokens(self, prompt_ids: Sequence[int]) -> Tensor:
        """(len(prompt_ids), S) training prompt token ids."""
        return self.train_prompts[torch.as_tensor(list(prompt_ids), dtype=torch.int64)]

    @torch.no_grad()
    def _respond(self, prompts: Tensor, answers: Tensor, generation: GenerationConfig) -> Responses:
        with self.eval_mode():
            ids = prompts.to(self.device)
            full = self.model.generate(  # type: ignore[operator]
                input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=generation
            )
        tokens = full[:, prompts.shape[1] :].cpu()  # (N, <= L)
        if tokens.shape[1] < self.budget:  # every response ended early
            filler = torch.full((tokens.shape[0], self.budget - tokens.shape[1]), self.pad_id, dtype=tokens.dtype)
            tokens = torch.cat([tokens, filler], dim=1)  # (N, L)
        return self.score(tokens, answers)

    def score(self, tokens: Tensor, answers: Tensor) -> Responses:
        """(N, L) response tokens padded to the budget, scored against (N, K) answers (:class:`Responses`)."""
        return Responses(
            tokens, answers, eos_id=self.eos_id, pad_id=self.pad_id, budget=self.budget, overlong=self.overlong
        )
