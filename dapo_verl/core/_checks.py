"""Input checks shared by every public function in `dapo_verl.core`.

Each check raises with the three parts every user-facing error needs: what was wrong (the argument
and its value or shape), why that is not allowed, and how to fix it.

Checks on values that live on the device cost a host synchronisation each. Hot paths therefore compute
their conditions as 0-dim bool flags and read them all back at once with :func:`read_flags`; only when a
flag is set do they read more (to name the first offending index), which happens on the error path alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "DeviceCheck",
    "check_finite",
    "check_float_dtype",
    "check_no_nan",
    "check_number",
    "check_real_data",
    "check_same_device",
    "check_same_shape",
    "check_tensor",
    "compute_dtype",
    "read_flags",
    "run_device_checks",
]


def check_tensor(name: str, value: object, *, ndim: int | Sequence[int], shape_doc: str) -> Tensor:
    """Return ``value`` if it is a tensor with an allowed number of dimensions.

    Args:
        name: Argument name used in the message.
        value: The argument.
        ndim: Allowed number of dimensions (one or several).
        shape_doc: The expected shape in the shape legend, e.g. ``"(P, G)"``.

    Raises:
        TypeError: if ``value`` is not a ``torch.Tensor``, or is complex (:func:`check_real_data`).
        ValueError: if it has the wrong number of dimensions, or is a meta tensor (:func:`check_real_data`).
    """
    if not isinstance(value, Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor of shape {shape_doc}, got {type(value).__name__}. "
            f"Convert it with torch.as_tensor(...)."
        )
    check_real_data(name, value)
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if value.ndim not in allowed:
        raise ValueError(
            f"{name} has shape {tuple(value.shape)} but must be {shape_doc} ({' or '.join(map(str, allowed))}-D). "
            f"Reshape it to {shape_doc}."
        )
    return value


def check_real_data(name: str, value: Tensor) -> None:
    """Raise unless ``value`` holds real values that can be read: not a meta tensor, not complex.

    A meta tensor has a shape but no data, so any check or result that reads it fails deep inside torch; a complex
    tensor would lose its imaginary part in the first conversion to a real dtype. Both checks read only metadata
    (no device synchronisation).

    Raises:
        ValueError: for a meta tensor.
        TypeError: for a complex dtype.
    """
    if value.is_meta:
        raise ValueError(
            f"{name} is a meta tensor (shape {tuple(value.shape)}, no data); its values are read, so a materialized "
            f"CPU or GPU tensor is expected. Pass the tensor after its values exist (e.g. created or loaded on 'cpu' "
            f"or 'cuda')."
        )
    if value.is_complex():
        raise TypeError(
            f"{name} has dtype {value.dtype} but must be real (bool, integer or floating point); converting it would "
            f"drop the imaginary part. Pass the real values (e.g. {name}.real)."
        )


def check_same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor, *, hint: str) -> None:
    """Raise unless ``a`` and ``b`` have the same shape.

    Raises:
        ValueError: naming both shapes and ``hint`` (how to fix it).
    """
    if a.shape != b.shape:
        raise ValueError(f"{name_a} has shape {tuple(a.shape)} but {name_b} has shape {tuple(b.shape)}; {hint}")


def check_same_device(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    """Raise unless ``a`` and ``b`` live on the same device."""
    if a.device != b.device:
        raise ValueError(
            f"{name_a} is on {a.device} but {name_b} is on {b.device}; all inputs must share one device. "
            f"Move them with .to({a.device!s})."
        )


def check_no_nan(name: str, value: Tensor, *, where: Tensor | None = None, fix: str) -> None:
    """Raise if ``value`` holds NaN (only at positions where ``where`` is True, if given).

    This reads a value back from the device (one synchronisation per call).

    Raises:
        ValueError: naming the first offending index and ``fix``.
    """
    _check_values(name, value, torch.isnan, "NaN", where=where, fix=fix)


def check_finite(name: str, value: Tensor, *, where: Tensor | None = None, fix: str) -> None:
    """Raise if ``value`` holds NaN or +-inf (only where ``where`` is True, if given). Synchronises once."""
    _check_values(name, value, lambda t: ~torch.isfinite(t), "NaN or inf", where=where, fix=fix)


def _check_values(name, value, is_bad, what, *, where, fix) -> None:
    if not value.is_floating_point():
        return
    bad = is_bad(value)
    if where is not None:
        bad = bad & where
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name} contains {what} (first at index {index}: {value[index].item()}); it cannot be trained on. {fix}"
        )


def check_float_dtype(name: str, value: Tensor) -> None:
    """Raise unless ``value`` is a floating-point tensor."""
    if not value.is_floating_point():
        raise TypeError(
            f"{name} has dtype {value.dtype} but must be floating point (float16, bfloat16, float32 or float64). "
            f"Convert it with .float()."
        )


def check_number(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_inclusive: bool = True,
    fix: str,
) -> float:
    """Return ``value`` as a float if it is a finite real number in range.

    Raises:
        TypeError: if it is not a real number (bools are rejected too).
        ValueError: if it is NaN, infinite or out of range; the message ends with ``fix``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}. {fix}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name}={value!r} is not finite. {fix}")
    if minimum is not None and (number < minimum or (not min_inclusive and number == minimum)):
        bound = ">=" if min_inclusive else ">"
        raise ValueError(f"{name}={value!r} must be {bound} {minimum}. {fix}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name}={value!r} must be <= {maximum}. {fix}")
    return number


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype ratios and losses are computed in: at least float32, float64 if any input is float64."""
    dtype = torch.float32
    for tensor in tensors:
        if tensor.is_floating_point():
            dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def read_flags(flags: Sequence[Tensor]) -> list[bool]:
    """Read 0-dim (or one-element) bool flags back from their device in a single synchronisation.

    Args:
        flags: Conditions computed on the device, True where something is wrong; all on one device.

    Returns:
        One bool per flag, in order; an empty list (and no synchronisation) for no flags.
    """
    if not flags:
        return []
    return [bool(hit) for hit in torch.stack([flag.reshape(()) for flag in flags]).tolist()]


class DeviceCheck(NamedTuple):
    """A condition computed on the device and the function that reports it on the host.

    ``flag`` is a 0-dim bool tensor, True when something is wrong; ``fail`` raises the error. ``fail`` runs
    only when the flag is set, so it may read more values back (to name the offending value or index).
    """

    flag: Tensor
    fail: Callable[[], None]


def run_device_checks(checks: Sequence[DeviceCheck]) -> None:
    """Read every flag in one synchronisation, then raise the first failing check's error, in order."""
    for hit, check in zip(read_flags([check.flag for check in checks]), checks):
        if hit:
            check.fail()
