"""The local backend's streaming engine (``algorithm.filter_groups.streaming=true``): decoding in chunks, as a
continuous-batching server decodes, so groups finish one by one and what the batch no longer needs can be aborted.

:class:`ChunkedEngine` is the :class:`~dapo_verl.sampler.engine.GenerationEngine` the batch replenisher drives in the
local backend when streaming. Every response still running, across every group in flight, advances by
``chunk_tokens`` tokens per decoding pass (Hugging Face ``generate`` on the prompt plus the response so far, left
padded); a response ends at its first EOS or at the response budget, and a group finishes when its last response
ends. ``collect`` decodes until at least one group has finished; ``abort`` stops between passes and returns each
unfinished group with its tokens so far, which the sampler may carry and submit again (the engine continues it from
that prefix within the remaining budget, on the current weights).

The older prefix. Each token records the policy version (training step) that sampled it. By default
(``local.rollout.stale_prefix=train``) a continued response's tokens sampled by an earlier policy are trained like
the rest: old log-probabilities are recomputed with the current policy, as verl's partial rollouts are without
rollout correction, so a token at most one step stale is treated as on-policy. With ``mask`` they are left out of the
loss (``payload["mask"]``) and only condition the tokens after them; the local backend keeps no rollout
log-probabilities, so it cannot weight them by importance instead. In the declared local comparison (docs/local.md,
26 seeds) ``mask`` lost 0.25 of held-out accuracy AUC against rounds -- on this task the answer is a response's
first token, which a continued group nearly always sampled before the abort -- and ``train`` held it. A group whose
tokens all come from one policy is the same either way.

Shape legend: G responses per group, S prompt length, L response budget, R running responses.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from dapo_verl.local.rollout import Rollout
from dapo_verl.sampler import GroupResult
from dapo_verl.sampler.engine import Aborted, Completion, PartialGroup, Request

__all__ = ["ChunkedEngine"]


@dataclass
class _Running:
    """One group in flight: each response's tokens so far, the policy version of each, and whether it ended."""

    request: Request
    tokens: list[list[int]]
    versions: list[list[int]]
    ended: list[bool] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(self.ended)


class ChunkedEngine:
    """Streaming generation on the local model (module docstring).

    Args:
        rollout: The local rollout: model, prompts, answers, sampling settings and scoring.
        chunk_tokens: Tokens each running response advances per decoding pass.
        stale_prefix: ``train`` (default) keeps a continued response's older-policy tokens in the loss (old log-probs
            recomputed by the current policy, as verl's partial rollouts are without rollout correction); ``mask``
            leaves them out.

    Attributes:
        policy_version: The training step whose weights generate now; the trainer sets it before each step.
    """

    streaming = True
    resumes_partials = True
    checks_groups = False

    def __init__(self, rollout: Rollout, *, chunk_tokens: int = 8, stale_prefix: str = "train") -> None:
        if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
            raise ValueError(f"chunk_tokens={chunk_tokens!r}; expected a positive integer (tokens per decoding pass).")
        if stale_prefix not in ("train", "mask"):
            raise ValueError(
                f"stale_prefix={stale_prefix!r}; expected 'train' (older-policy tokens kept in the loss) "
                f"or 'mask' (left out of it)."
            )
        self.rollout = rollout
        self.chunk_tokens = chunk_tokens
        self.stale_prefix = stale_prefix
        self.policy_version = 0
        self.passes = 0
        self._running: dict[int, _Running] = {}

    def submit(self, requests: Sequence[Request]) -> None:
        for request in requests:
            if request.resume is None:
                size = self.rollout.n
                self._running[request.request_id] = _Running(
                    request, [[] for _ in range(size)], [[] for _ in range(size)], [False] * size
                )
                continue
            saved = request.resume.payload
            self._running[request.request_id] = _Running(
                request, [list(t) for t in saved["tokens"]], [list(v) for v in saved["versions"]], list(saved["ended"])
            )

    def collect(self) -> list[Completion]:
        """Decode until at least one group has finished; return every finished group."""
        while True:
            done = [rid for rid, group in self._running.items() if group.finished]
            if done:
                return [self._completion(self._running.pop(rid)) for rid in done]
            self._decode_pass()

    def abort(self) -> Aborted:
        """Every group in flight, as a partial group (nothing finished goes uncollected: ``collect`` returns all)."""
        partial = []
        for group in self._running.values():
            payload = {
                "tokens": [list(t) for t in group.tokens],
                "versions": [list(v) for v in group.versions],
                "ended": list(group.ended),
            }
            partial.append(
                (
                    group.request,
                    PartialGroup(
                        prompt_id=group.request.prompt_id,
                        tokens=sum(len(t) for t in group.tokens),
                        finished=sum(group.ended),
                        group_size=len(group.tokens),
                        payload=payload,
                    ),
                )
            )
        self._running.clear()
        return Aborted(partial=partial)

    # -- decoding ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def _decode_pass(self) -> None:
        """Advance every running response by up to ``chunk_tokens`` tokens."""
        rows = [(group, r) for group in self._running.values() for r, ended in enumerate(group.ended) if not ended]
        rollout, budget = self.rollout, self.rollout.budget
        prompts = rollout.prompt_tokens([group.request.prompt_id for group, _ in rows])  # (R, S)
        width = max(len(group.tokens[r]) for group, r in rows)
        ids = torch.full((len(rows), prompts.shape[1] + width), rollout.pad_id, dtype=torch.int64)
        attention = torch.zeros_like(ids)
        for i, (group, r) in enumerate(rows):  # left padding: every row ends where its next token goes
            row = torch.cat([prompts[i], torch.tensor(group.tokens[r], dtype=torch.int64)])
            ids[i, ids.shape[1] - len(row) :], attention[i, ids.shape[1] - len(row) :] = row, 1
        steps = min(self.chunk_tokens, budget - min(len(group.tokens[r]) for group, r in rows))
        config = copy.deepcopy(rollout.sampling)
        config.max_new_tokens = steps
        with rollout.eval_mode():
            out = rollout.model.generate(
                input_ids=ids.to(rollout.device),  # type: ignore[operator]
                attention_mask=attention.to(rollout.device),
                generation_config=config,
            )
        new = out[:, ids.shape[1] :].cpu()  # (R, <= steps)
        self.passes += 1
        for i, (group, r) in enumerate(rows):
            self._extend(group, r, new[i].tolist(), budget)

    def _extend(self, group: _Running, r: int, new: list[int], budget: int) -> None:
        """Append a pass's tokens to response ``r`` up to its first EOS or the budget; count them."""
        room = budget - len(group.tokens[r])
        taken = new[:room]
        if self.rollout.eos_id in taken:
            taken = taken[: taken.index(self.rollout.eos_id) + 1]
            group.ended[r] = True
        group.tokens[r].extend(taken)
        group.versions[r].extend([self.policy_version] * len(taken))
        group.ended[r] = group.ended[r] or len(group.tokens[r]) >= budget
        self.rollout.generated_tokens += len(taken)

    def _completion(self, group: _Running) -> Completion:
        """The finished group, scored as the round-based rollout scores one, its older prefix trained or masked
        (``stale_prefix``)."""
        rollout, request = self.rollout, group.request
        size, budget = len(group.tokens), rollout.budget
        tokens = torch.full((size, budget), rollout.pad_id, dtype=torch.int64)  # (G, L)
        versions = torch.full((size, budget), -1, dtype=torch.int64)  # (G, L)
        for r in range(size):
            tokens[r, : len(group.tokens[r])] = torch.tensor(group.tokens[r], dtype=torch.int64)
            versions[r, : len(group.versions[r])] = torch.tensor(group.versions[r], dtype=torch.int64)
        answers = rollout.train_answers[request.prompt_id].expand(size, -1)  # (G, K)
        out = rollout.score(tokens, answers)
        return request, GroupResult(
            prompt_id=request.prompt_id,
            metric=out.acc,
            response_lengths=out.lengths,
            truncated=out.truncated,
            scores=out.scores,
            payload={
                "tokens": out.tokens,
                "exact": out.exact,
                "versions": versions,
                "mask": out.mask if self.stale_prefix == "train" else current_policy_mask(out.mask, versions),
            },
        )


def current_policy_mask(mask: Tensor, versions: Tensor) -> Tensor:
    """(G, L) bool: ``mask`` restricted to the tokens sampled by the policy that sampled the group's last tokens.

    Args:
        mask: (G, L) bool, True on each response's tokens.
        versions: (G, L) int64, the policy version (training step) of each token; -1 after a response's end.
    """
    latest = versions.max()
    return mask & (versions == latest)
