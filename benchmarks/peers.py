"""The published pre-rollout prompt selectors, GRESO and MoPPS, on dapo_verl's sampler interface (benchmarks only).

Both decide *which* prompts a generation round asks for; everything else -- the group filter, the refill, the
round sizes, the step budget, the accounting -- is the same :class:`~dapo_verl.sampler.BatchReplenisher` every
strategy of ``bench_sampler`` and ``bench_local`` runs, so a comparison isolates the selection rule. Each is
written from its paper and public code (read, not copied), with the hyper-parameters of the authors' scripts:

* **GRESO** (Zheng et al., "Act Only When It Pays", arXiv 2506.02177; code Infini-AI-Lab/GRESO at b2778431,
  ``verl/trainer/ttis/presampling_selector.py`` and ``ray_trainer.py``). Every generated group appends its mean
  reward to the prompt's trace. Before generation a visited prompt is skipped with probability
  ``1 - max(p_easy ** k, 0.01)`` when its last k groups in a row were easy (mean >= 0.98: all correct), else, when
  its last group was hard (mean <= 0.11: all wrong), ``1 - max(p_hard ** k, 0.01)`` for its k hard groups in a
  row; a prompt without a trace is never skipped. Once per training step (after the first epoch) p_easy and
  p_hard move by 0.01 towards a target zero-variance share of 0.25 among the groups generated that step, a third
  easy and two thirds hard: a share at or above its target lowers p (more skipping), below raises it; both stay
  in [0.05, 0.95], starting at 0.5. Used as in the authors' math scripts (``math_qwen_7b_dm_greso.sh``).
  GRESO's own batch sizing (a 1.25 margin over the last round's zero-variance share) is not used: the rounds
  are the shared replenisher's, so only the skip rule is compared.
* **MoPPS** (Qu et al., "Can Prompt Difficulty be Online Predicted ...", arXiv 2507.04632; code
  thu-rllab/MoPPS at a883f519, ``recipe/ours/mopps.py`` and ``our_ray_trainer.py``). Each prompt has a
  Beta(alpha, beta) belief over its success rate, Beta(1, 1) until it is first generated; a generated group of
  G responses with s correct updates ``alpha <- lam * alpha + (1 - lam) * 1 + s`` and ``beta <- lam * beta +
  (1 - lam) * 1 + (G - s)``. A round that wants n prompts draws ``ts_ratio * n`` candidates, samples one rate
  from each belief (Thompson sampling) and takes the n whose sample is closest to the target 0.5 (the ``topk``
  strategy). Two configurations of the authors' scripts: ``math`` (``ts_ratio`` 16, ``lam`` 1, i.e. no
  forgetting; ``scripts/math/math_verl_1.5b_topk_noinit.sh``) and ``countdown`` (``ts_ratio`` 8, ``lam`` 0.5;
  ``scripts/countdown/cd_verl_3b_topk_noinit.sh``). MoPPS's shipped scripts do not filter groups; here the shared
  replenisher filters and refills as for every strategy.

Both reuse :class:`~dapo_verl.sampler.PromptStream` for the seeded data order: GRESO through its per-visit skip
hook, MoPPS through ranked selection with a :class:`~dapo_verl.sampler.stream.PromptScorer` and no
``explore_fraction`` (Thompson sampling is its exploration). Neither predicts a round's yield, so the rounds are
sized from the keep rate, as for the other strategies without prediction.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from dapo_verl.config import SamplerConfig
from dapo_verl.core import DropReason
from dapo_verl.sampler import BatchReplenisher, GenerateFn, PromptStream, SampledBatch
from dapo_verl.sampler.sizing import estimate_sample_size

__all__ = ["MOPPS_CONFIGS", "PEERS", "GresoStream", "MoppsScorer", "peer_sampler"]

GRESO_EASY, GRESO_HARD = 0.98, 0.11  # mean-reward thresholds of an easy / hard group (presampling_selector.py)
GRESO_MIN_GENERATE = 0.01  # floor of p ** k: every prompt keeps 1 chance in 100
GRESO_TARGET_ZERO_VARIANCE = 0.25
GRESO_STEP, GRESO_P_RANGE, GRESO_P_START = 0.01, (0.05, 0.95), 0.5
MOPPS_TARGET = 0.5

MOPPS_CONFIGS: dict[str, tuple[float, float]] = {"math": (16.0, 1.0), "countdown": (8.0, 0.5)}
"""MoPPS configuration -> (ts_ratio: candidates per prompt, lam: forgetting), from the authors' scripts."""


class GresoStream(PromptStream):
    """The data order with GRESO's skip rule (module docstring); :meth:`end_step` adapts p_easy and p_hard.

    Args:
        num_prompts: Size of the prompt pool.
        seed: Seed of the data order and the skip draws.
        revisit_capacity: As for :class:`PromptStream` (0: none, as in GRESO).
    """

    def __init__(self, num_prompts: int, *, seed: int, revisit_capacity: int = 0) -> None:
        super().__init__(num_prompts, seed=seed, skip_uninformative=True, revisit_capacity=revisit_capacity)
        self.p_easy = self.p_hard = GRESO_P_START
        self._trace: dict[int, list[float]] = {}  # prompt id -> mean reward of each generated group
        self._step_groups = [0, 0, 0]  # this step: generated, all correct, all wrong

    def _run(self, prompt_id: int, hit: Any) -> int:
        count = 0
        for mean in reversed(self._trace.get(prompt_id, [])):
            if not hit(mean):
                break
            count += 1
        return count

    def skip_probability(self, prompt_id: int) -> float:
        trace = self._trace.get(prompt_id)
        if not trace:
            return 0.0
        easy = self._run(prompt_id, lambda m: m >= GRESO_EASY)
        if easy:
            return 1.0 - max(self.p_easy**easy, GRESO_MIN_GENERATE)
        if trace[-1] <= GRESO_HARD:
            return 1.0 - max(self.p_hard ** self._run(prompt_id, lambda m: m <= GRESO_HARD), GRESO_MIN_GENERATE)
        return 0.0

    def record(
        self, prompt_id: int, reason: DropReason, *, correct: int | None = None, group_size: int | None = None
    ) -> float | None:
        if correct is not None and group_size:
            mean = correct / group_size
            self._trace.setdefault(prompt_id, []).append(mean)
            self._step_groups[0] += 1
            self._step_groups[1] += mean == 1.0
            self._step_groups[2] += mean == 0.0
        return super().record(prompt_id, reason, correct=correct, group_size=group_size)

    def end_step(self) -> None:
        """Move p_easy and p_hard by one step towards the target zero-variance shares (after the first epoch)."""
        generated, easy, hard = self._step_groups
        self._step_groups = [0, 0, 0]
        if not generated or self.epoch == 0:
            return
        self.p_easy = _towards_target(self.p_easy, easy / generated, GRESO_TARGET_ZERO_VARIANCE / 3)
        self.p_hard = _towards_target(self.p_hard, hard / generated, GRESO_TARGET_ZERO_VARIANCE * 2 / 3)


def _towards_target(p: float, share: float, target: float) -> float:
    """GRESO's update: a zero-variance share at or above its target lowers p (more skipping), else raises it."""
    low, high = GRESO_P_RANGE
    return min(high, max(low, p + (-GRESO_STEP if share >= target else GRESO_STEP)))


class MoppsScorer:
    """MoPPS's per-prompt Beta beliefs and Thompson-sampled closeness to the target rate (module docstring).

    Args:
        forgetting: ``lam``: the weight an observation leaves on the earlier belief (1: no forgetting).
    """

    def __init__(self, *, forgetting: float) -> None:
        self.forgetting = forgetting
        self.step = 0
        self._belief: dict[int, tuple[float, float]] = {}

    @property
    def ready(self) -> bool:
        return True

    def scores(self, prompt_ids: Sequence[int]) -> list[float]:
        """The posterior mean rate's closeness to the target (MoPPS predicts no yield; these are not used)."""
        return [-((a / (a + b) - MOPPS_TARGET) ** 2) for a, b in (self._belief.get(p, (1.0, 1.0)) for p in prompt_ids)]

    def rank_keys(self, prompt_ids: Sequence[int], generator: torch.Generator) -> list[float]:
        draw = random.Random(int(torch.randint(2**62, (), generator=generator))).betavariate
        return [-((draw(*self._belief.get(p, (1.0, 1.0))) - MOPPS_TARGET) ** 2) for p in prompt_ids]

    def evidence(self, prompt_ids: Sequence[int]) -> list[float]:
        """Not used: MoPPS explores by Thompson sampling (``explore_fraction`` 0)."""
        return [sum(self._belief.get(p, (1.0, 1.0))) for p in prompt_ids]

    def taken(self, prompt_ids: Sequence[int]) -> None:
        """MoPPS notes nothing before generation."""

    def record(self, prompt_id: int, correct: int, group_size: int) -> None:
        alpha, beta = self._belief.get(prompt_id, (1.0, 1.0))
        keep = self.forgetting
        self._belief[prompt_id] = (
            keep * alpha + (1.0 - keep) + correct,
            keep * beta + (1.0 - keep) + group_size - correct,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"belief": sorted([p, a, b] for p, (a, b) in self._belief.items())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._belief = {int(p): (float(a), float(b)) for p, a, b in state.get("belief", [])}


class PeerReplenisher(BatchReplenisher):
    """The shared replenisher with a peer's prompt stream; GRESO's p adapts after every training step."""

    def next_batch(self) -> SampledBatch:
        batch = super().next_batch()
        if isinstance(self.stream, GresoStream):
            self.stream.end_step()
        return batch


PEERS = ("greso", "mopps_math", "mopps_countdown")
"""The peer strategies :func:`peer_sampler` builds."""


def peer_sampler(peer: str, config: SamplerConfig, num_prompts: int, generate: GenerateFn) -> BatchReplenisher:
    """A replenisher whose prompt choice is ``peer``'s (one of :data:`PEERS`); the rest of ``config`` applies as
    given, except dapo_verl's own skipping, prediction and revisits, which the peers replace."""
    if peer not in PEERS:
        raise ValueError(f"Unknown peer {peer!r}. Known: {list(PEERS)}.")
    plain = replace(config, skip_uninformative=False, revisit_informative=False)
    sampler = PeerReplenisher(plain, num_prompts, generate)
    if peer == "greso":
        sampler.stream = GresoStream(num_prompts, seed=config.seed)
    else:
        ts_ratio, forgetting = MOPPS_CONFIGS[peer.removeprefix("mopps_")]
        sampler.stream = PromptStream(
            num_prompts,
            seed=config.seed,
            skip_uninformative=True,
            smoothing_groups=estimate_sample_size(config),
            scorer=MoppsScorer(forgetting=forgetting),
            selection_window=ts_ratio,
            explore_fraction=0.0,
        )
    return sampler
