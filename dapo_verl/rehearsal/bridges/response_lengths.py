"""DAPO-like response lengths for a rehearsal's stand-in model, on either engine (the CPU replica or vLLM).

A random stand-in model rarely emits EOS, so by default nearly every response runs to the budget and every group
takes as long as every other: aborting a tail changes nothing. ``actor_rollout_ref.rollout.engine_kwargs.dapo_cpu.
response_lengths=long_tail`` (and ``median_fraction``, default 0.15 of the budget) makes each request draw a length
from :class:`~dapo_verl.sampler.simulated_engine.LongTailLengths` -- most far below the budget, a tail to it, about
0.7% past it and so truncated -- seeded like the request's tokens, so a resumed run draws the same lengths. A
continued request, whose prompt holds its earlier tokens, draws its remaining length afresh.

How each engine keeps to the drawn length:

* the CPU replica (:mod:`.cpu_rollout`) keeps EOS out of the sampling before it and takes EOS at it;
* vLLM (:mod:`.cpu_vllm`) gets ``min_tokens = max_tokens = length`` (vLLM masks EOS until ``min_tokens``): the
  response ends at its length without EOS, which verl and the reward treat as a finished response (not truncated:
  shorter than the budget); a length past the budget runs to the budget and is truncated.

Either way the reported log-probabilities are the model's own (on vLLM the rehearsal sets ``logprobs_mode=
raw_logprobs``: the processed ones would include the EOS mask; so it needs temperature 1), and verl's
rollout-versus-actor check compares like with like.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from typing import Any

from dapo_verl.sampler.simulated_engine import LongTailLengths

__all__ = ["OPTIONS_ENGINE", "length_shape", "shape_vllm_request", "target_length"]

OPTIONS_ENGINE = "dapo_cpu"
"""The ``engine_kwargs`` entry that holds the length options (the CPU replica's name; read by both engines)."""


def length_shape(config: Any) -> LongTailLengths | None:
    """The rollout config's length shape (``engine_kwargs.dapo_cpu``), or None when the model decides.

    Raises:
        ValueError: for an unknown option, shape or median fraction, naming the key and the choices.
    """
    options = dict((getattr(config, "engine_kwargs", None) or {}).get(OPTIONS_ENGINE) or {})
    key = f"actor_rollout_ref.rollout.engine_kwargs.{OPTIONS_ENGINE}"
    unknown = sorted(set(options) - {"response_lengths", "median_fraction"})
    if unknown:
        raise ValueError(
            f"{key} has unknown keys {unknown}; expected response_lengths (model or long_tail) and median_fraction."
        )
    shape = options.get("response_lengths", "model")
    if shape not in ("model", "long_tail"):
        raise ValueError(
            f"{key}.response_lengths={shape!r}; expected model (the stand-in model decides) or "
            f"long_tail (DAPO-like lengths)."
        )
    fraction = options.get("median_fraction", 0.15)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(
            f"{key}.median_fraction={fraction!r}; expected a share of the response budget in (0, 1], e.g. 0.15."
        )
    if shape == "model":
        return None
    return LongTailLengths(median=max(1.0, fraction * config.response_length))


def target_length(shape: LongTailLengths, prompt_ids: Sequence[int], seed: int) -> int:
    """The length (tokens, >= 1) a request with these prompt ids and sampling seed draws."""
    prompt = zlib.crc32(bytes(str(list(prompt_ids)), "ascii"))
    return max(1, round(shape.draw(prompt, 0, random.Random(seed))))


def shape_vllm_request(params: dict[str, Any], shape: LongTailLengths, prompt_ids: Sequence[int], config: Any) -> int:
    """Set a vLLM request's ``min_tokens`` and ``max_tokens`` to its drawn length within its budget; return it.

    The budget is the request's own ``max_tokens`` (``max_new_tokens``) when it has one -- verl's partial-rollout
    client gives a continued request what is left -- else verl's default for the prompt
    (``vllm_async_server.generate``: the response length, within the prompt and response lengths together).
    ``params`` must hold the request's ``seed``.
    """
    given = params.pop("max_tokens", None) or params.pop("max_new_tokens", None)
    budget = (
        int(given)
        if given
        else min(config.response_length, config.prompt_length + config.response_length - len(prompt_ids))
    )
    length = max(1, min(target_length(shape, prompt_ids, int(params["seed"])), budget))
    params["max_tokens"] = params["min_tokens"] = length
    return length
