"""What the batch replenisher says when a step stops generating before its batch is full.

A step stops at the round limit (``max_num_gen_batches``), at the end of its prompt budget, or, with
``on_shortfall=partial``, after a probe round when the rest of the budget cannot be expected to fill the batch
(``yield``, :func:`~dapo_verl.sampler.sizing.yield_stops`). The message states what happened --
the groups found, rounds, prompts and keep rate of the step, and which limit stopped it -- and the settings that
would have filled the batch; with ``on_shortfall=error`` it is a :class:`ShortfallError`, with ``partial`` one INFO
line (the metric ``dapo/sampler/partial`` records the step).
"""

from __future__ import annotations

from collections.abc import Mapping

from dapo_verl.config import RefillStrategy, SamplerConfig, ShortfallPolicy
from dapo_verl.sampler.sizing import step_prompt_budget

__all__ = ["ShortfallError", "shortfall_message"]


class ShortfallError(RuntimeError):
    """A step stopped generating (round limit, prompt budget, or expected yield) before its batch was full, and
    ``on_shortfall=error``."""


def shortfall_message(
    config: SamplerConfig,
    *,
    step: int,
    found: int,
    limit: str,
    counters: Mapping[str, int],
    keep_rate_estimate: float | None,
) -> str:
    """The shortfall message (module docstring).

    Args:
        config: The sampler settings.
        step: The training step.
        found: Informative groups the step has.
        limit: What stopped it: ``rounds``, ``budget`` or ``yield``.
        counters: This step's ``groups_generated``, ``gen_rounds``, ``prompts_requested`` and ``groups_kept``.
        keep_rate_estimate: The sampler's running keep-rate estimate (None before any round).
    """
    generated, kept = counters["groups_generated"], counters["groups_kept"]
    rate = 100.0 * kept / generated if generated else 0.0
    scarce = rate < 50
    cause = "most groups were all-correct or all-wrong" if scarce else "the rounds were too small to fill the batch"
    budget = step_prompt_budget(config)
    reason = {
        "rounds": f"the round limit algorithm.filter_groups.max_num_gen_batches={config.max_num_gen_batches}",
        "budget": f"the step's budget of max_num_gen_batches x max(data.gen_batch_size, data.train_batch_size) = "
        f"{budget} prompts",
        "yield": f"the rest of the step's budget of {budget} prompts could not be expected to fill the batch at "
        f"the keep-rate estimate {100 * (keep_rate_estimate or 0.0):.1f}%",
    }[limit]
    partial = config.on_shortfall == ShortfallPolicy.PARTIAL
    knobs = _knobs(config, budget_spent=limit != "rounds", scarce=scarce)
    return (
        f"Dynamic sampling has {found} of {config.train_batch_size} groups for step {step} after "
        f"{counters['gen_rounds']} rounds and {counters['prompts_requested']} prompts ({reason}): {kept} of the "
        f"{generated} groups generated this step were informative (keep rate {rate:.1f}%), so {cause}. To fill "
        f"batches, {' or '.join(knobs)}"
        + ("." if partial else "; or set algorithm.filter_groups.on_shortfall=partial to train on what was found.")
    )


def _knobs(config: SamplerConfig, *, budget_spent: bool, scarce: bool) -> list[str]:
    """The settings that would have filled the batch."""
    knobs = ["raise algorithm.filter_groups.max_num_gen_batches"]
    if config.refill == RefillStrategy.BARRIER:
        knobs.append("raise data.gen_batch_size or use refill=adaptive")
    elif budget_spent:
        knobs.append("raise data.gen_batch_size")
    else:
        knobs.append("raise algorithm.filter_groups.max_oversample_factor")
    if scarce and not config.skip_uninformative:
        knobs.append("set algorithm.filter_groups.skip_uninformative=true")
    return knobs
