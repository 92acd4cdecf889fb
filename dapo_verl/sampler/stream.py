"""Seeded, resumable prompt order, with optional history-based skipping of uninformative prompts.

Prompts are visited epoch by epoch in a permutation drawn from ``(seed, epoch)``, so the whole stream is
reproduced from two integers. Skipping follows the idea of GRESO (arXiv 2506.02177): a prompt whose last
``k`` groups were all correct or all wrong is passed over with probability
``min(max_skip_probability, 1 - skip_keep_base**k)``; every skip lowers ``k`` by one, so the probability
decays back and no prompt is skipped for good.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["PromptStream"]

_EPOCH_SEED_STRIDE = 1_000_003


class PromptStream:
    """Hands out prompt ids from ``range(num_prompts)``, epoch after epoch.

    Args:
        num_prompts: Size of the prompt source.
        seed: Seed of the per-epoch permutations and the skip draws.
        shuffle: Visit prompts in a seeded random order (True) or in index order.
        skip_uninformative: Enable history-based skipping (see the module docstring).
        skip_keep_base: Base of the keep probability ``skip_keep_base**k``.
        max_skip_probability: Cap on the skip probability; must be < 1.
    """

    def __init__(
        self,
        num_prompts: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        skip_uninformative: bool = False,
        skip_keep_base: float = 0.5,
        max_skip_probability: float = 0.9,
    ) -> None:
        if isinstance(num_prompts, bool) or not isinstance(num_prompts, int) or num_prompts < 1:
            raise ValueError(
                f"num_prompts={num_prompts!r}: the prompt source is empty; the sampler needs at least one prompt. "
                f"Check the training data path."
            )
        self.num_prompts = num_prompts
        self.seed = seed
        self.shuffle = shuffle
        self.skip_uninformative = skip_uninformative
        self.skip_keep_base = skip_keep_base
        self.max_skip_probability = max_skip_probability
        self.epoch = 0
        self.position = 0
        self.prompts_consumed = 0
        self.prompts_skipped = 0
        self._streak: dict[int, int] = {}
        self._rng = torch.Generator().manual_seed(seed)
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_prompts))
        gen = torch.Generator().manual_seed(self.seed * _EPOCH_SEED_STRIDE + epoch)
        return torch.randperm(self.num_prompts, generator=gen).tolist()

    def _next_id(self) -> int:
        if self.position == self.num_prompts:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        prompt_id = self._order[self.position]
        self.position += 1
        return prompt_id

    def skip_probability(self, prompt_id: int) -> float:
        """Current probability that ``prompt_id`` is passed over."""
        streak = self._streak.get(prompt_id, 0)
        if not self.skip_uninformative or streak == 0:
            return 0.0
        return min(self.max_skip_probability, 1.0 - self.skip_keep_base**streak)

    def take(self, count: int) -> tuple[list[int], int]:
        """The next ``count`` prompt ids, and how many prompts were skipped to find them.

        After ``num_prompts`` skips in a row the next prompt is taken regardless, so the call always ends.
        """
        ids: list[int] = []
        skipped = 0
        run = 0
        while len(ids) < count:
            prompt_id = self._next_id()
            probability = self.skip_probability(prompt_id)
            if probability > 0 and run < self.num_prompts and float(torch.rand((), generator=self._rng)) < probability:
                self._streak[prompt_id] -= 1  # decays back: the next visit is likelier to generate
                if self._streak[prompt_id] == 0:
                    del self._streak[prompt_id]
                skipped += 1
                run += 1
                continue
            run = 0
            ids.append(prompt_id)
        self.prompts_consumed += len(ids)
        self.prompts_skipped += skipped
        return ids, skipped

    def record(self, prompt_id: int, *, informative: bool) -> None:
        """Update a prompt's history after its group was scored."""
        if informative:
            self._streak.pop(prompt_id, None)
        else:
            self._streak[prompt_id] = self._streak.get(prompt_id, 0) + 1

    @property
    def history_size(self) -> int:
        """Prompts currently holding a non-zero uninformative streak (at most ``num_prompts``)."""
        return len(self._streak)

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state: position, counters, histories and the skip RNG."""
        return {
            "num_prompts": self.num_prompts,
            "epoch": self.epoch,
            "position": self.position,
            "prompts_consumed": self.prompts_consumed,
            "prompts_skipped": self.prompts_skipped,
            "streak": sorted([pid, k] for pid, k in self._streak.items()),
            "rng": self._rng.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the prompt source must have the same size."""
        if int(state["num_prompts"]) != self.num_prompts:
            raise ValueError(
                f"The saved sampler state covers {state['num_prompts']} prompts but the prompt source has "
                f"{self.num_prompts}; resume with the same training data, or start a fresh run."
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.prompts_consumed = int(state["prompts_consumed"])
        self.prompts_skipped = int(state["prompts_skipped"])
        self._streak = {int(pid): int(k) for pid, k in state["streak"]}
        self._rng.set_state(state["rng"])
        self._order = self._permutation(self.epoch)
