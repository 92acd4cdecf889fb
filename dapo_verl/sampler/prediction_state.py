"""Reading a saved :class:`~dapo_verl.sampler.prediction.SuccessPredictor` state, every part checked first.

The state is what :meth:`~dapo_verl.sampler.prediction.SuccessPredictor.state_dict` writes: the training step, G,
one row ``[prompt, correct, wrong, step of its last group, whether that group was informative]`` per prompt, the
prior's three decayed moments, two calibration buckets of (predicted, observed) sums, and the prompts taken but not
yet recorded as ``[prompt, bucket, prediction]``. A missing part starts empty; anything else that does not fit is one
``ValueError`` naming the part (:mod:`~dapo_verl.sampler.state_parts`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NamedTuple

from dapo_verl.sampler.state_parts import read_amount, read_amounts, read_count, read_flag, read_rows, state_mapping

__all__ = ["PredictorState", "read_predictor_state"]

_OWNER = "SuccessPredictor"


class PredictorState(NamedTuple):
    """A predictor's state, checked, in the form the predictor keeps it."""

    step: int
    group_size: int | None
    prompts: dict[int, tuple[float, float, int, bool]]
    moments: list[float]
    calibration: list[list[float]]
    taken: dict[int, tuple[int, float]]


def read_predictor_state(state: object, known: Collection[str]) -> PredictorState:
    """The parts of ``state``, checked; ``known``: the keys a state of this predictor may hold.

    Raises:
        TypeError: for a state that is not a mapping.
        ValueError: naming an unknown key, or a part of the wrong type or range (a negative count, G below 2, a
            prediction outside [0, 1], ...).
    """
    state = state_mapping(_OWNER, state, known)
    size = state.get("group_size")
    prompts = {
        _count("prompts", pid): (
            _amount("prompts", c),
            _amount("prompts", w),
            _count("prompts", s),
            read_flag(_OWNER, "prompts", i),
        )
        for pid, c, w, s, i in read_rows(_OWNER, "prompts", state.get("prompts", []), 5)
    }
    buckets = read_rows(_OWNER, "calibration", state.get("calibration", [[0.0, 0.0]] * 2), 2, 2)
    taken = {
        _count("taken", pid): (read_count(_OWNER, "taken", b, high=1), _amount("taken", q, high=1.0))
        for pid, b, q in read_rows(_OWNER, "taken", state.get("taken", []), 3)
    }
    return PredictorState(
        step=_count("step", state.get("step", 0)),
        group_size=None if size is None else read_count(_OWNER, "group_size", size, low=2),
        prompts=prompts,
        moments=read_amounts(_OWNER, "moments", state.get("moments", [0.0, 0.0, 0.0]), 3),
        calibration=[read_amounts(_OWNER, "calibration", bucket, 2) for bucket in buckets],
        taken=taken,
    )


def _count(key: str, value: Any) -> int:
    return read_count(_OWNER, key, value)


def _amount(key: str, value: Any, high: float | None = None) -> float:
    return read_amount(_OWNER, key, value, high=high)
