"""What the batch replenisher accepts from outside: ``generate``'s groups and the state it is asked to load.

:class:`~dapo_verl.sampler.BatchReplenisher` calls a backend's ``generate`` callback and, on resume, loads a
state someone saved. Both arrive from code the sampler does not control, so both are checked here before the
sampler uses them, and a broken contract is a ``TypeError`` or ``ValueError`` that names the prompt, the field
and the fix -- never an ``AttributeError`` from deep inside the sampler, and never a sampler left half-restored.

* :func:`checked_groups`: one :class:`~dapo_verl.sampler.types.GroupResult` per requested prompt id, in order;
  each field a tensor of shape (G,) with G >= 2; integer, non-negative lengths; a finite filter metric;
  boolean (or 0/1) truncation flags; optional scores of the same shape, finite.
* :func:`check_state`: the parts of a :meth:`~dapo_verl.sampler.BatchReplenisher.state_dict` the sampler reads,
  with their types (other keys are left to their readers). :func:`restoring` then restores the sampler's own
  state when loading fails anyway, so the sampler is either fully loaded or unchanged.

Shape legend: G responses per prompt.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from dapo_verl.sampler.types import GroupResult

__all__ = ["check_state", "checked_groups", "restoring"]

_STATE_FIX = (
    "Pass what BatchReplenisher.state_dict() returned (saved with dapo_verl.state_io.save_state), or start a fresh run."
)


def checked_groups(prompt_ids: Sequence[int], groups: object) -> list[GroupResult]:
    """``generate``'s result as a list, once it keeps the callback contract (see the module docstring).

    Raises:
        TypeError: for a result that is not a sequence of GroupResult, or a field of the wrong type.
        ValueError: for a count, order, shape or value that breaks the contract.
    """
    if isinstance(groups, str | bytes | Mapping) or not isinstance(groups, Sequence | Iterator):
        raise TypeError(
            f"generate returned {type(groups).__name__}; it must return a list of GroupResult, one per "
            f"requested prompt id, in order."
        )
    groups = list(groups)
    if len(groups) != len(prompt_ids):
        raise ValueError(
            f"generate returned {len(groups)} groups for {len(prompt_ids)} prompts; it must return one "
            f"GroupResult per requested prompt id, in order."
        )
    for prompt_id, group in zip(prompt_ids, groups):
        _check_group(prompt_id, group)
    return groups


def _check_group(prompt_id: int, group: object) -> None:
    if not isinstance(group, GroupResult):
        raise TypeError(
            f"generate returned a {type(group).__name__} for prompt {prompt_id}; each item must be a "
            f"dapo_verl.sampler.GroupResult."
        )
    if isinstance(group.prompt_id, bool) or not isinstance(group.prompt_id, int) or group.prompt_id != prompt_id:
        raise ValueError(
            f"generate returned a group for prompt {group.prompt_id!r} where prompt {prompt_id} was "
            f"requested; return groups in the order of prompt_ids, with int prompt ids."
        )
    fields = {
        "metric": group.metric,
        "response_lengths": group.response_lengths,
        "truncated": group.truncated,
        **({"scores": group.scores} if group.scores is not None else {}),
    }
    for name, value in fields.items():
        if not isinstance(value, Tensor):
            raise TypeError(
                f"prompt {prompt_id}: {name} is a {type(value).__name__}; it must be a (G,) tensor, one "
                f"value per response. Convert it with torch.as_tensor(...)."
            )
        if value.is_meta:
            raise ValueError(
                f"prompt {prompt_id}: {name} is a meta tensor (no data); the sampler reads every value, "
                f"so generate must return materialized CPU or GPU tensors."
            )
        if value.is_complex():
            raise TypeError(
                f"prompt {prompt_id}: {name} has dtype {value.dtype}; it must hold real values (bool, "
                f"integer or floating point). Return the real per-response values."
            )
    size = group.metric.shape
    if group.metric.ndim != 1 or size[0] < 2:
        raise ValueError(
            f"prompt {prompt_id}: metric has shape {tuple(size)}; expected (G,) with G >= 2 responses. "
            f"Set rollout.n >= 2."
        )
    for name, value in fields.items():
        if value.shape != size:
            raise ValueError(
                f"prompt {prompt_id}: {name} has shape {tuple(value.shape)} but metric has "
                f"{tuple(size)}; report one value per response."
            )
    _check_values(prompt_id, group)


def _check_values(prompt_id: int, group: GroupResult) -> None:
    if group.metric.is_floating_point() and not bool(torch.isfinite(group.metric).all()):
        raise ValueError(
            f"prompt {prompt_id}: metric holds {group.metric.tolist()}; the filter metric (raw "
            f"correctness) must be a finite number for every response. Check the reward function."
        )
    lengths = group.response_lengths
    if lengths.is_floating_point() or lengths.dtype == torch.bool or bool((lengths < 0).any()):
        raise ValueError(
            f"prompt {prompt_id}: response_lengths holds {lengths.tolist()} ({lengths.dtype}); lengths "
            f"are non-negative integer token counts. Count the valid response tokens."
        )
    truncated = group.truncated
    if truncated.dtype != torch.bool and not bool(((truncated == 0) | (truncated == 1)).all()):
        raise ValueError(
            f"prompt {prompt_id}: truncated holds {truncated.tolist()}; it flags each response cut off "
            f"at the budget, as bool (or 0/1)."
        )
    if group.scores is not None and group.scores.is_floating_point() and not bool(torch.isfinite(group.scores).all()):
        raise ValueError(
            f"prompt {prompt_id}: scores holds {group.scores.tolist()}; the logged reward must be finite "
            f"for every response. Check the reward function."
        )


_PARTS: dict[str, Callable[[Any], bool]] = {
    "counters": lambda v: isinstance(v, Mapping),
    "dropped": lambda v: isinstance(v, Mapping),
    "keep_rate_estimate": lambda v: (
        v is None or (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v <= 1)
    ),
    "stream": lambda v: isinstance(v, Mapping),
    "carried": lambda v: isinstance(v, list | tuple),
}
_CARRIED = ("born_step", "prompt_id", "metric", "response_lengths", "truncated")


def check_state(state: object, readable_versions: Sequence[int]) -> None:
    """Raise unless ``state`` has the parts a sampler state has, with their types (see the module docstring).

    Raises:
        TypeError: for a state that is not a mapping.
        ValueError: for a state of another version, or a missing or mistyped part.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"the sampler state is {type(state).__name__}, not a mapping; {_STATE_FIX}")
    if state.get("version") not in readable_versions:
        raise ValueError(
            f"Sampler state version {state.get('version')!r} is not one of {list(readable_versions)}; it was written "
            f"by another dapo_verl release. Resume with the release that wrote it or start a fresh run."
        )
    for part, fits in _PARTS.items():
        if part not in state or not fits(state[part]):
            shown = "missing" if part not in state else f"a {type(state[part]).__name__}"
            raise ValueError(
                f"the sampler state's {part!r} is {shown}; the state is damaged or was not written by "
                f"BatchReplenisher.state_dict(). {_STATE_FIX}"
            )
    _check_counts(state)
    for index, item in enumerate(state["carried"]):
        missing = [key for key in _CARRIED if not isinstance(item, Mapping) or key not in item]
        if missing:
            raise ValueError(
                f"the sampler state's carried group {index} lacks {missing}; the state is damaged. {_STATE_FIX}"
            )


_SIGNED_COUNTERS = ("metric_sum", "score_sum")
"""Counters that sum a metric or score (-1/1 encodings make them negative); every other counter counts up from 0."""


def _check_counts(state: Mapping[str, Any]) -> None:
    """Raise unless every counter is a finite number (>= 0 unless it sums a signed metric) and every drop count an
    integer >= 0: a negative count would make the conservation check and every rate metric wrong."""
    parts = [("counters", key, value) for key, value in state["counters"].items()]
    for part in ("dropped", "dropped_aborted"):
        drops = state.get(part, {})
        if not isinstance(drops, Mapping):
            raise ValueError(
                f"the sampler state's {part!r} is a {type(drops).__name__}; the state is damaged or was "
                f"not written by BatchReplenisher.state_dict(). {_STATE_FIX}"
            )
        parts += [(part, key, value) for key, value in drops.items()]
    for part, key, value in parts:
        number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        whole = part == "counters" or (number and float(value).is_integer())
        if not number or not whole or (value < 0 and key not in _SIGNED_COUNTERS):
            kind = (
                "a finite number"
                if key in _SIGNED_COUNTERS
                else "a finite number >= 0"
                if part == "counters"
                else "an integer >= 0"
            )
            raise ValueError(
                f"the sampler state's {part}[{key!r}] is {value!r}; it must be {kind}, as "
                f"BatchReplenisher.state_dict() writes it. {_STATE_FIX}"
            )


@contextlib.contextmanager
def restoring(snapshot: Callable[[], dict[str, Any]], restore: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """Run a load that may fail half-way; on failure put the sampler back as it was and name what failed.

    Args:
        snapshot: The sampler's current state (its ``state_dict``), taken before the load.
        restore: Loads a state known to be good (the snapshot).

    Raises:
        ValueError: for any error of the load, after restoring the snapshot (a reader's own ValueError unchanged).
    """
    before = snapshot()
    try:
        yield
    except ValueError:
        restore(before)
        raise  # the readers' own messages (another prompt count, ...) already say what to do
    except (KeyError, IndexError, TypeError, AttributeError, RuntimeError) as err:
        restore(before)
        raise ValueError(
            f"the sampler state could not be loaded ({type(err).__name__}: {' '.join(str(err).split())});"
            f" it is damaged or does not fit this sampler, which is left as it was. {_STATE_FIX}"
        ) from err
