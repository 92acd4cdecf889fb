"""The ceiling of prompt prediction on the local run: predictors that know every prompt's exact pass rate.

Issue 21 asks that the local run generate at least 3x fewer responses per trained one than verl-recipe's sampler,
by predicting which prompts will be informative, at held-out accuracy no lower than the shipped default's. Every
predictor measured so far (ours, GRESO's, MoPPS's and the candidates of :mod:`benchmarks.candidates`) stops near
2.5x. These ask what *any* predictor of pass rates could do inside the shared
:class:`~dapo_verl.sampler.BatchReplenisher`: they replace the beliefs by the truth. Before each round the oracle
computes, for every candidate prompt, the exact probability that one response sampled from the current policy is
correct, with one forward pass of the policy over the prompt and its answer (:func:`exact_pass_rates`: the product
of the answer tokens' probabilities at the rollout temperature, which is what the verifier's ``acc`` asks of a
response's first K tokens; the rollout applies no top-k or top-p). Its predictions are the exact chance of an
informative group, ``q = 1 - p^G - (1 - p)^G``, uncalibrated. Three ways to use them, each a ranking of the
round's candidates (ties keep the data order):

* ``oracle``: keys ``q``, the most informative candidates first;
* ``oracle_capped``: keys ``min(q, mean q of the candidates)``, the exact analogue of the package's capped ranking
  (which caps at a fresh prompt's predicted chance, the population's mean): candidates above the mean tie, so it
  passes over the less informative without concentrating on the most informative;
* ``oracle_skip``: keys ``min(q, SKIP_BELOW)``: it passes over only prompts nearly sure to give an uninformative
  group and otherwise keeps the data order, so what is trained stays what uniform visits would train.

There is no exploration (``explore_fraction`` 0: nothing is unknown). Round sizing is the package's, from the
predicted yield of the prompts taken; its window of ``selection_window`` candidates per prompt wanted, doubled while
the yield falls short, bounds how far a round looks. The forward passes are not counted as generation: these are
bounds on what prediction can save, not strategies. Their predictions are calibrated, as exact ones should be
(informative groups observed over predicted, seed 5's whole run: 0.987 for ``oracle_skip``, 1.023 for
``oracle_capped``); the test checks the pass rates against sampled responses.

Measured on the default local run (seeds 5-24, declared before the runs; benchmarks/README.md): ``oracle_skip``
costs what the shipped default costs (5.33 against 5.35 responses per trained, paired -0.02 [-0.45, +0.41]) at the
same held-out accuracy; ``oracle_capped`` is 3.69x fewer than verl-recipe's sampler on the mean but trains to 0.43
lower accuracy; ``oracle`` collapses onto the prompts the policy half-knows (accuracy 0.16).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from dapo_verl.config import SamplerConfig
from dapo_verl.sampler import BatchReplenisher, GenerateFn
from dapo_verl.sampler.prediction import SuccessPredictor
from dapo_verl.sampler.sizing import estimate_sample_size

__all__ = ["ORACLES", "OraclePredictor", "exact_pass_rates", "oracle_sampler"]

ORACLES = ("oracle", "oracle_capped", "oracle_skip")
"""The oracle strategies :func:`oracle_sampler` builds (module docstring)."""

SKIP_BELOW = 0.01
"""``oracle_skip``: informative chance below which a prompt is passed over (1 in 100: nearly sure to be wasted)."""


@torch.no_grad()
def exact_pass_rates(rollout: Any, prompt_ids: Sequence[int]) -> list[float]:
    """Probability that one response sampled by ``rollout`` (a :class:`~dapo_verl.local.rollout.Rollout`) is correct,
    for each training prompt id: ``prod_k softmax(logits_k / T)[answer_k]`` over the answer's K tokens, teacher
    forced after the prompt (prompts of a task have one length, so no padding is involved)."""
    index = torch.as_tensor(list(prompt_ids), dtype=torch.int64)
    prompts, answers = rollout.train_prompts[index], rollout.train_answers[index]  # (P, S), (P, K)
    inputs = torch.cat([prompts, answers[:, :-1]], dim=1).to(rollout.device)  # (P, S + K - 1)
    model = rollout.model
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits  # (P, S + K - 1, V)
    finally:
        model.train(was_training)
    start = prompts.shape[1] - 1
    scaled = logits[:, start:, :].float() / float(rollout.sampling.temperature)  # (P, K, V)
    logp = torch.log_softmax(scaled, dim=-1).gather(-1, answers.to(scaled.device).unsqueeze(-1)).squeeze(-1)
    return logp.sum(dim=1).exp().cpu().tolist()


class OraclePredictor(SuccessPredictor):
    """The package's predictor with its beliefs replaced by exact pass rates (module docstring).

    Args:
        pass_rates: ``prompt ids -> exact pass rates`` under the current policy.
        group_size: G, responses per prompt.
        smoothing_groups: As for :class:`~dapo_verl.sampler.prediction.SuccessPredictor` (the calibration metric).
        cap: Ranking keys are ``min(q, cap)``: None leaves them uncapped, ``"mean"`` caps at the mean of the
            candidates ranked, a number caps there.
    """

    def __init__(
        self,
        pass_rates: Callable[[Sequence[int]], list[float]],
        *,
        group_size: int,
        smoothing_groups: float,
        cap: float | str | None = None,
    ) -> None:
        super().__init__(half_life_steps=1.0, smoothing_groups=smoothing_groups, prefer_informative=cap is None)
        if cap is not None and cap != "mean" and not (isinstance(cap, float) and 0.0 < cap <= 1.0):
            raise ValueError(f"cap={cap!r}: expected None, 'mean' or a number in (0, 1].")
        self.pass_rates, self.cap = pass_rates, cap
        self.group_size = group_size

    def informative_many(self, prompt_ids: Sequence[int]) -> list[float]:
        if not prompt_ids:
            return []
        assert self.group_size is not None
        size = self.group_size
        # max(): 1 - p^G - (1-p)^G is >= 0 exactly; only float rounding at p = 0 or 1 can take it below
        return [max(0.0, 1.0 - p**size - (1.0 - p) ** size) for p in self.pass_rates(prompt_ids)]

    def scores(self, prompt_ids: Sequence[int]) -> list[float]:
        """The exact informative chances, uncalibrated (they need no calibration)."""
        return self.informative_many(prompt_ids)

    def rank_keys(self, prompt_ids: Sequence[int], generator: torch.Generator) -> list[float]:
        keys = self.scores(prompt_ids)
        if self.cap is None or not keys:
            return keys
        cap = sum(keys) / len(keys) if self.cap == "mean" else float(self.cap)
        return [min(key, cap) for key in keys]

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError("The oracle reads the live policy; it has no state to resume (benchmarks only).")


_CAPS: dict[str, float | str | None] = {"oracle": None, "oracle_capped": "mean", "oracle_skip": SKIP_BELOW}


def oracle_sampler(name: str, config: SamplerConfig, num_prompts: int, generate: GenerateFn) -> BatchReplenisher:
    """The package's replenisher with ``prompt_selection=predicted`` and the oracle's predictions; ``generate`` must
    be the local backend's :class:`~dapo_verl.local.rollout.Rollout` (the oracle reads its policy)."""
    if name not in ORACLES:
        raise ValueError(f"Unknown oracle {name!r}. Known: {list(ORACLES)}.")
    if not all(hasattr(generate, key) for key in ("model", "train_prompts", "train_answers", "sampling", "n")):
        raise TypeError(f"The oracle reads the policy of the local backend's Rollout; got {type(generate).__name__}.")
    config = replace(config, prompt_selection="predicted", skip_uninformative=True, explore_fraction=0.0)
    sampler = BatchReplenisher(config, num_prompts, generate)
    predictor = OraclePredictor(
        lambda ids: exact_pass_rates(generate, ids),
        group_size=int(generate.n),  # type: ignore[attr-defined]
        smoothing_groups=estimate_sample_size(config),
        cap=_CAPS[name],
    )
    sampler.predictor = predictor
    sampler.stream.scorer = predictor
    return sampler
