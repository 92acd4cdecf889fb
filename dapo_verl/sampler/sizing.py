"""How many prompts to ask for in a generation round.

``barrier`` always asks for a fixed round (verl-recipe). ``adaptive`` treats each prompt as kept with the
running keep-rate estimate p and asks for the smallest n whose kept count reaches the missing m groups
with probability ``single_round_probability`` under a normal approximation of Binomial(n, p):

    n p - z sqrt(n p (1 - p)) >= m,   z = Phi^-1(single_round_probability),

capped at ``max_oversample_factor * m`` so a collapsing keep rate cannot explode a request.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from dapo_verl.config import RefillStrategy, SamplerConfig

__all__ = ["request_size", "update_keep_rate"]


def request_size(config: SamplerConfig, missing: int, keep_rate: float | None) -> int:
    """Prompts to generate in the next round.

    Args:
        config: The sampler settings.
        missing: Groups still needed to fill the batch (>= 1).
        keep_rate: Running estimate of the share of groups kept, or None before the first round.

    Returns:
        A positive number of prompts.
    """
    if config.refill == RefillStrategy.BARRIER or keep_rate is None or not config.enable:
        return config.prompts_per_round if config.enable else missing
    cap = math.ceil(config.max_oversample_factor * missing)
    p = min(max(keep_rate, 1.0 / config.max_oversample_factor), 1.0)
    z = NormalDist().inv_cdf(config.single_round_probability)
    spread = z * math.sqrt(p * (1.0 - p))
    root = (spread + math.sqrt(spread * spread + 4.0 * p * missing)) / (2.0 * p)
    return max(missing, min(cap, math.ceil(root * root)))


def update_keep_rate(estimate: float | None, kept: int, generated: int, smoothing: float) -> float | None:
    """Exponential moving average of the per-round keep rate (None until a round has been seen)."""
    if generated == 0:
        return estimate
    observed = kept / generated
    if estimate is None:
        return observed
    return (1.0 - smoothing) * estimate + smoothing * observed
