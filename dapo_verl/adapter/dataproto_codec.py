"""Checkpointable form of verl ``DataProto`` slices, for groups the sampler carries across steps.

Tensors stay tensors; the object arrays of ``non_tensor_batch`` become JSON-compatible lists (numpy scalars
and arrays are converted); ``meta_info`` must already be plain data. Anything else is refused with a
message naming the key, so a checkpoint never silently loses a carried group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from verl import DataProto

__all__ = ["DataProtoCodec"]


def _plain(value: Any, where: str) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return {"__ndarray__": _plain(value.tolist(), where), "dtype": str(value.dtype)}
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, where) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(
        f"Cannot checkpoint a carried group: non_tensor_batch value at {where} is a {type(value).__name__}. "
        f"Set algorithm.filter_groups.surplus=discard, or keep such data out of the rollout output."
    )


def _restore(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__ndarray__", "dtype"}:
            return np.asarray(_restore(value["__ndarray__"]), dtype=value["dtype"])
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


def _object_array(items: list[Any]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        array[i] = item
    return array


class DataProtoCodec:
    """``encode``/``decode`` between a ``DataProto`` and nested plain data with tensors."""

    def encode(self, data: DataProto) -> dict[str, Any]:
        tensors = {key: value.detach().cpu() for key, value in data.batch.items()} if data.batch is not None else {}
        non_tensors = {
            key: [_plain(v, f"{key}[{i}]") for i, v in enumerate(values)]
            for key, values in data.non_tensor_batch.items()
        }
        return {"tensors": tensors, "non_tensors": non_tensors, "meta_info": _plain(data.meta_info, "meta_info")}

    def decode(self, encoded: dict[str, Any]) -> DataProto:
        tensors: dict[str, torch.Tensor] = dict(encoded["tensors"])
        non_tensors = {
            key: _object_array([_restore(v) for v in values]) for key, values in encoded["non_tensors"].items()
        }
        return DataProto.from_dict(
            tensors=tensors or None, non_tensors=non_tensors, meta_info=_restore(encoded["meta_info"])
        )
