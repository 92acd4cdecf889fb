"""What the rollout engine refuses of the values verl hands it, checked before anything starts.

verl builds vLLM's engine arguments from ``actor_rollout_ref.rollout.*`` when it starts a replica
(``verl/workers/rollout/vllm_rollout/vllm_async_server.py``, ``launch_server``): ``gpu_memory_utilization``,
``max_num_seqs``, ``max_num_batched_tokens``, ``tensor_model_parallel_size`` (as ``tensor_parallel_size``),
``dtype``, ``logprobs_mode``, ``scheduling_policy``, ... ; a key of ``actor_rollout_ref.rollout.engine_kwargs.vllm``
overrides the argument of its name (a ``null`` there is dropped). vLLM checks them only then -- after Ray, the
workers and the actor have started -- so a value outside vLLM's range fails a rehearsal minutes in and a cluster
run after loading the model. :func:`engine_problems` applies the same rules to the composed config, one
:class:`~dapo_verl.preflight.Problem` per refused value.

The rules are vLLM's own (vLLM 0.27; each cites its file and line), mirrored rather than called: vLLM is an
optional extra that a head node or CI machine may lack, and importing its config classes takes seconds and sets up
vLLM's logging. ``tests/integration/test_preflight.py`` builds vLLM's own classes with the values refused here,
where vLLM is installed, so the two cannot drift apart unnoticed.

One rule is verl's and holds for every engine: ``max_model_len``, when set, holds a whole prompt and response,
``prompt_length + response_length`` tokens. verl caps a response at ``max_model_len`` minus its prompt's length
(``vllm_async_server.py``, ``generate``; the other engines do the same), cutting it short of ``response_length``
without a word, and fails a prompt that leaves no room.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dapo_verl.preflight import Problem

__all__ = ["VLLM_CHOICES", "VLLM_NUMBERS", "engine_problems"]

_ROLLOUT = "actor_rollout_ref.rollout"
_OVERRIDES = f"{_ROLLOUT}.engine_kwargs.vllm"
_WHEN = "vLLM refuses it only when verl starts the engine, minutes into the run, after the actor's model has loaded"

VLLM_NUMBERS: dict[str, tuple[str, bool, Callable[[float], bool], str, str]] = {
    # vLLM argument: (rollout key verl passes as it, integer?, vLLM's range, the range in words, a valid value)
    # vllm/config/cache.py:68  gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)
    "gpu_memory_utilization": (
        "gpu_memory_utilization",
        False,
        lambda v: 0 < v <= 1,
        "0 < gpu_memory_utilization <= 1 (the share of each GPU's memory vLLM may take)",
        "a share in (0, 1], e.g. 0.8 (the paper recipes' value)",
    ),
    # vllm/config/scheduler.py:63  max_num_seqs: int = Field(default=DEFAULT_MAX_NUM_SEQS, ge=1)
    "max_num_seqs": (
        "max_num_seqs",
        True,
        lambda v: v >= 1,
        "max_num_seqs >= 1, an integer (sequences per scheduler step)",
        "an integer >= 1, e.g. 256 (verl's default)",
    ),
    # vllm/config/scheduler.py:49  max_num_batched_tokens: int = Field(default=..., ge=1)
    "max_num_batched_tokens": (
        "max_num_batched_tokens",
        True,
        lambda v: v >= 1,
        "max_num_batched_tokens >= 1, an integer (tokens per scheduler step)",
        "an integer >= max_num_seqs, e.g. 8192 (verl's default)",
    ),
    # vllm/config/parallel.py:124  tensor_parallel_size: int = Field(default=1, ge=1)
    "tensor_parallel_size": (
        "tensor_model_parallel_size",
        True,
        lambda v: v >= 1,
        "tensor_parallel_size >= 1, an integer (GPUs per engine)",
        "an integer >= 1, e.g. 1, or 4 as in the paper recipes",
    ),
    # vllm/config/parallel.py:129  data_parallel_size: int = Field(default=1, ge=1); verl sizes a replica as
    # tensor x data x pipeline GPUs (verl/workers/rollout/replica.py:107), so 0 fails before vLLM sees it
    "data_parallel_size": (
        "data_parallel_size",
        True,
        lambda v: v >= 1,
        "data_parallel_size >= 1, an integer (engines per replica)",
        "1 (verl's default)",
    ),
}
"""vLLM's numeric ranges, per engine argument verl passes (see the comments for vLLM's source)."""

VLLM_CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {
    # vLLM argument: (rollout key verl passes as it, the values vLLM's command line accepts); null is dropped
    # vllm/config/model.py:98  ModelDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]
    "dtype": ("dtype", ("auto", "half", "float16", "bfloat16", "float", "float32")),
    # vllm/config/model.py:99  LogprobsMode = Literal["raw_logits", "raw_logprobs", "processed_logits", ...]
    "logprobs_mode": ("logprobs_mode", ("raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs")),
    # vllm/config/scheduler.py:22  SchedulerPolicy = Literal["fcfs", "priority"]
    "scheduling_policy": ("scheduling_policy", ("fcfs", "priority")),
}
"""The closed sets of values vLLM's command line accepts (``vllm serve`` exits on any other)."""


def engine_problems(config: DictConfig) -> list[Problem]:
    """Each rollout engine value vLLM (or verl, for ``max_model_len``) refuses when the engine starts.

    Args:
        config: A composed and resolved verl config (not modified).

    Returns:
        One problem per refused value: the key and value, vLLM's range, and the fix. vLLM's rules apply when
        ``actor_rollout_ref.rollout.name`` is ``vllm``; the ``max_model_len`` rule applies to every engine.
    """
    rollout = OmegaConf.select(config, _ROLLOUT)
    if not isinstance(rollout, DictConfig):
        return []  # a rollout section that is not one is reported by the other checks
    problems = _length_problems(f"{_ROLLOUT}.max_model_len", rollout.get("max_model_len"), rollout, given=False)
    if rollout.get("name") != "vllm":
        return problems
    kwargs = rollout.get("engine_kwargs")
    overrides = kwargs.get("vllm") if isinstance(kwargs, DictConfig) else None
    given = _given(overrides) if isinstance(overrides, DictConfig) else {}
    for argument, (key, integer, admits, range_text, fix) in VLLM_NUMBERS.items():
        for where, value, cli in [(f"{_ROLLOUT}.{key}", rollout.get(key), False), *_overridden(given, argument)]:
            number = _number(value, integer, cli)
            if number is None:
                problems.append(
                    Problem(
                        where,
                        f"{where}={value!r} is not {'an integer' if integer else 'a number'}; "
                        f"vLLM's range is {range_text}, and {_WHEN}. Set {where} to {fix}.",
                    )
                )
            elif not admits(number):
                problems.append(
                    Problem(
                        where, f"{where}={value!r} is outside vLLM's range {range_text}; {_WHEN}. Set {where} to {fix}."
                    )
                )
    for argument, (key, known) in VLLM_CHOICES.items():
        for where, value, _ in [(f"{_ROLLOUT}.{key}", rollout.get(key), False), *_overridden(given, argument)]:
            if value is not None and value not in known:
                problems.append(
                    Problem(
                        where,
                        f"{where}={value!r} is not one of vLLM's {argument} values "
                        f"({', '.join(known)}); `vllm serve` exits on it when verl starts "
                        f"the engine. Set {where} to one of them.",
                    )
                )
    for where, value, _ in _overridden(given, "max_model_len"):
        problems += _length_problems(where, value, rollout, given=True)
    return problems + _budget_problems(rollout, given, {p.key for p in problems})


def _given(overrides: DictConfig) -> dict[str, tuple[str, Any]]:
    """``engine_kwargs.vllm``'s keys that reach vLLM: ``{argument: (full key, value)}``, nulls dropped as verl
    drops them; vLLM's command line reads ``gpu-memory-utilization`` as ``gpu_memory_utilization``."""
    plain = OmegaConf.to_container(overrides, resolve=True)
    assert isinstance(plain, dict)  # a DictConfig's container is a dict
    return {
        str(name).replace("-", "_"): (f"{_OVERRIDES}.{name!s}", value)
        for name, value in plain.items()
        if value is not None
    }


def _overridden(given: Mapping[str, tuple[str, Any]], argument: str) -> list[tuple[str, Any, bool]]:
    """``[(full key, value, True)]`` when ``engine_kwargs.vllm`` sets ``argument`` (it reaches vLLM as text)."""
    return [(*given[argument], True)] if argument in given else []


def _number(value: Any, integer: bool, cli: bool) -> float | None:
    """``value`` as vLLM reads it, or None when it cannot: verl passes a rollout key's value as typed, and an
    ``engine_kwargs`` value as command-line text (which vLLM parses with ``int`` or ``float``)."""
    if isinstance(value, bool):
        return None  # verl turns a bool into a bare flag, which vLLM refuses
    if cli and isinstance(value, str):
        try:
            return int(value) if integer else float(value)
        except ValueError:
            return None
    if isinstance(value, int) or (not integer and isinstance(value, float)):
        return value
    return None


def _lengths(rollout: DictConfig) -> tuple[int, int] | None:
    """``(prompt_length, response_length)`` when both are positive integers (else the data-key checks report
    them)."""
    prompt, response = rollout.get("prompt_length"), rollout.get("response_length")
    if all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (prompt, response)):
        return prompt, response
    return None


def _length_problems(key: str, value: Any, rollout: DictConfig, *, given: bool) -> list[Problem]:
    """``max_model_len`` is null (the model's context length) or holds ``prompt_length + response_length``."""
    if value is None:
        return []
    if given and isinstance(value, str):
        text, value = value, _readable_length(value)
        if value is None:
            return [
                Problem(
                    key,
                    f"{key}={text!r} is not a length vLLM's command line reads (an integer, 32k = "
                    f"32,000, 32K = 32,768, or auto); `vllm serve` exits on it when verl starts the "
                    f"engine. Set {key} to an integer >= prompt_length + response_length, or drop it.",
                )
            ]
        if value == -1:
            return []  # auto: the model's context length
    lengths = _lengths(rollout)
    if isinstance(value, bool) or not isinstance(value, int):
        return [
            Problem(
                key,
                f"{key}={value!r} is not an integer; verl compares it with the model's context length "
                f"at start-up and fails. Set {key} to an integer >= prompt_length + response_length, or "
                f"null for the model's context length.",
            )
        ]
    if lengths is None or value >= sum(lengths):
        return []
    prompt, response = lengths
    fails = "every prompt" if value <= 1 else f"a prompt of {value} tokens or more"
    # verl/workers/rollout/vllm_rollout/vllm_async_server.py:593-617: max_tokens = min(response_length,
    # max_model_len - len(prompt)), and a ValueError when max_model_len - len(prompt) < 1; vLLM itself stops a
    # sequence at its max_model_len (vllm/v1/core/sched/utils.py:113) and refuses a longer prompt
    who = "vLLM stops each sequence" if given else "verl caps each response"
    return [
        Problem(
            key,
            f"{key}={value} is below prompt_length + response_length = {prompt} + {response} = "
            f"{prompt + response} tokens; {who} at {value} tokens of prompt and response, cutting "
            f"responses short of response_length={response} without a word, and fails on {fails}. "
            f"Set {key} >= {prompt + response}, or null for the model's context length.",
        )
    ]


def _readable_length(text: str) -> int | None:
    """``text`` as vLLM's command line reads a length, or None when it refuses it: an integer, a decimal or binary
    suffix (``25.6k``, ``32K``), or ``auto``/``-1`` (-1: the model's context length).

    Mirrors vllm/utils/argparse_utils.py:29 ``human_readable_int`` and :75 ``human_readable_int_or_auto`` (0.27).
    """
    text = text.strip()
    if text == "-1" or text.lower() == "auto":
        return -1
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    if match:
        number, suffix = match.groups()
        if suffix.islower():  # decimal multipliers take decimals
            return int(float(number) * 1000 ** ("kmgt".index(suffix) + 1))
        return int(number) * 1024 ** ("KMGT".index(suffix) + 1) if number.isdigit() else None
    try:
        return int(text)
    except ValueError:
        return None


def _effective(rollout: DictConfig, given: Mapping[str, tuple[str, Any]], argument: str) -> tuple[str, Any, bool]:
    """``(full key, value, as text?)`` of what vLLM gets for ``argument``: ``engine_kwargs.vllm``'s, else the
    rollout key's."""
    if argument in given:
        return (*given[argument], True)
    key = VLLM_NUMBERS[argument][0]
    return f"{_ROLLOUT}.{key}", rollout.get(key), False


def _budget_problems(rollout: DictConfig, given: Mapping[str, tuple[str, Any]], refused: set[str]) -> list[Problem]:
    """vLLM's ``max_num_batched_tokens >= max_num_seqs``, on the values vLLM gets (once each is in range)."""
    tokens_key, tokens, tokens_text = _effective(rollout, given, "max_num_batched_tokens")
    seqs_key, seqs, seqs_text = _effective(rollout, given, "max_num_seqs")
    budget, sequences = _number(tokens, True, tokens_text), _number(seqs, True, seqs_text)
    if budget is None or sequences is None or refused & {tokens_key, seqs_key}:
        return []
    raised, longest = "", rollout.get("max_model_len")
    if not rollout.get("enable_chunked_prefill"):
        if not isinstance(longest, int):
            return []  # verl raises the budget to the model's context length, which only the model's config holds
        if longest > budget:
            # vllm_async_server.py:1113: without chunked prefill verl raises the budget to max_model_len first
            budget, raised = longest, f" (verl raises it to max_model_len={longest} without chunked prefill)"
    if budget >= sequences:
        return []
    # vllm/config/scheduler.py:263  if self.max_num_batched_tokens < self.max_num_seqs: raise ValueError(...)
    return [
        Problem(
            tokens_key,
            f"{tokens_key}={tokens!r}{raised} is below {seqs_key}={seqs!r}; vLLM's range is "
            f"max_num_batched_tokens >= max_num_seqs (each sequence of a scheduler step takes "
            f"at least one token of its budget), and {_WHEN}. Set {tokens_key} >= {sequences:g} "
            f"or {seqs_key} <= {budget:g}.",
        )
    ]
