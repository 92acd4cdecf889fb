"""A seeded stand-in for a policy: per-prompt pass rates instead of a model.

Used by the sampler's tests and benchmark, and handy for sizing ``algorithm.filter_groups`` settings
before a cluster run: each response to prompt i at training step t is correct with probability
``pass_rate(i, t)``, has a random length, and is truncated when that length reaches the budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from dapo_verl.sampler.types import GroupResult

__all__ = ["LATENCY_SEED_OFFSET", "SimulatedPolicy", "drifting_pass_rates", "group_latencies"]

LATENCY_SEED_OFFSET = 104_729
"""Added to a run's seed for its latency generator, so latency draws never shift the outcome draws."""


def group_latencies(gen: torch.Generator, count: int) -> list[float]:
    """How long each of ``count`` simulated groups takes to finish, in generation budgets: U(0.5, 1).

    A group ends with its longest response, so it takes at least half the budget and at most all of it; the
    benchmarks and the verl fakes time their simulated rounds with it.
    """
    return (0.5 + 0.5 * torch.rand(count, generator=gen, dtype=torch.float64)).tolist()


def drifting_pass_rates(
    num_prompts: int,
    *,
    seed: int = 0,
    start_logit_mean: float = -1.0,
    start_logit_std: float = 2.0,
    drift_per_step: float = 0.02,
) -> Callable[[int, int], float]:
    """Pass rates that start spread out and rise as training proceeds.

    Prompt i starts at logit ``l_i ~ N(start_logit_mean, start_logit_std)`` and gains ``drift_per_step``
    logits per training step, so the share of all-correct groups keeps rising (paper Fig. 3b).
    """
    gen = torch.Generator().manual_seed(seed)
    logits = (start_logit_mean + start_logit_std * torch.randn(num_prompts, generator=gen)).tolist()

    def pass_rate(prompt_id: int, step: int) -> float:
        return 1.0 / (1.0 + math.exp(-(logits[prompt_id] + drift_per_step * step)))

    return pass_rate


class SimulatedPolicy:
    """Callable ``generate`` for :class:`~dapo_verl.sampler.BatchReplenisher` driven by pass rates.

    Args:
        pass_rate: ``pass_rate(prompt_id, step) -> probability`` of a correct response.
        group_size: G, responses per prompt.
        max_response_length: Generation budget; lengths are drawn uniformly in [1, budget + slack] and
            clipped, so roughly ``slack / (budget + slack)`` of responses are truncated.
        slack: See ``max_response_length``.
        seed: Seed of the draws; each call uses the next slice of one generator.

    Attributes:
        step: The training step the simulated policy is at; advance it as training proceeds.
        calls: Number of generate calls so far.
    """

    def __init__(
        self,
        pass_rate: Callable[[int, int], float],
        *,
        group_size: int = 8,
        max_response_length: int = 64,
        slack: int = 8,
        seed: int = 0,
    ) -> None:
        self.pass_rate = pass_rate
        self.group_size = group_size
        self.max_response_length = max_response_length
        self.slack = slack
        self.step = 0
        self.calls = 0
        self._gen = torch.Generator().manual_seed(seed)

    def __call__(self, prompt_ids: Sequence[int]) -> list[GroupResult]:
        self.calls += 1
        groups = []
        for prompt_id in prompt_ids:
            p = self.pass_rate(prompt_id, self.step)
            correct = torch.rand(self.group_size, generator=self._gen) < p
            raw = torch.randint(1, self.max_response_length + self.slack + 1, (self.group_size,), generator=self._gen)
            lengths = raw.clamp(max=self.max_response_length)
            groups.append(
                GroupResult(
                    prompt_id=prompt_id,
                    metric=correct,
                    response_lengths=lengths,
                    truncated=raw >= self.max_response_length,
                    scores=correct.to(torch.float32) * 2 - 1,
                    payload={"prompt_id": torch.tensor(prompt_id), "correct": correct},
                )
            )
        return groups
