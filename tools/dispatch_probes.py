"""Two probes that watch every aten operator of a call: host synchronisations, and peak tensor memory.

Both hook in as a :class:`~torch.utils._python_dispatch.TorchDispatchMode`, so they see every operator the
call runs -- inside verl, inside torch's Python code, and in the backward pass -- on any device. Neither
changes what is computed; both slow it down, so never time a call while a probe is on.

:func:`count_host_syncs` counts the operations that make the host wait for the device on a GPU, whatever
device the call runs on (on CPU nothing waits, but the same operations would). Counted:

* ``aten::_local_scalar_dense`` -- every ``.item()``, ``bool(t)``, ``float(t)``, ``int(t)``, a tensor in an
  ``if`` or in ``range``;
* operators whose output size depends on the data: ``nonzero``, ``masked_select``, ``unique`` and its
  variants, ``repeat_interleave`` without ``output_size``, and ``index`` / ``index_put`` with a boolean
  index (``x[mask]``);
* operators that return a Python value computed from the data: ``equal``, ``allclose``, ``is_nonzero``;
* copies of a non-CPU tensor to the CPU (``_to_copy`` / ``copy_``);
* ``Tensor.tolist``, ``Tensor.numpy`` and ``Tensor.__array__``, which read a tensor without going through an
  operator on CPU (on a GPU each is a device-to-host copy); they are counted by wrapping the methods.

:class:`PeakTensorMemory` measures the peak of the bytes held by tensors that the call's operators
create (forward and backward, the call's outputs and the gradients included), above what was allocated
before it: the inputs and views of them are not counted. Storages shared by views count once; a storage is
released when its last tensor dies. Scratch buffers that an operator allocates and frees inside its own
kernel are not seen, nor is memory outside tensors.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["PeakTensorMemory", "count_host_syncs", "host_sync_operators"]

_SCALAR_READS = {"aten::_local_scalar_dense", "aten::equal", "aten::allclose", "aten::is_nonzero"}
_DATA_DEPENDENT_SHAPES = {
    "aten::nonzero",
    "aten::masked_select",
    "aten::unique",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::unique_dim_consecutive",
}
_BOOL_INDEXED = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}
_HOST_READ_METHODS = ("tolist", "numpy", "__array__")


def _is_bool_index(indices: object) -> bool:
    return isinstance(indices, (list, tuple)) and any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )


def _copies_to_host(name: str, args: tuple, kwargs: dict) -> bool:
    if name == "aten::_to_copy":
        source, target = args[0], kwargs.get("device")
        return source.device.type != "cpu" and target is not None and torch.device(target).type == "cpu"
    if name == "aten::copy_":
        target, source = args[0], args[1]
        return target.device.type == "cpu" and source.device.type != "cpu"
    return False


def host_sync_operators(func: Any, args: tuple, kwargs: dict) -> bool:
    """True when the aten operator ``func`` called with ``args`` makes the host wait for the device."""
    name = func._schema.name
    if name in _SCALAR_READS or name in _DATA_DEPENDENT_SHAPES:
        return True
    if name == "aten::repeat_interleave":
        return kwargs.get("output_size") is None and isinstance(args[0], torch.Tensor) and len(args) < 3
    if name in _BOOL_INDEXED:
        return _is_bool_index(args[1] if len(args) > 1 else kwargs.get("indices"))
    return _copies_to_host(name, args, kwargs)


class _SyncCounter(TorchDispatchMode):
    def __init__(self, record: list[str]) -> None:
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if host_sync_operators(func, args, kwargs):
            self.record.append(func._schema.name)
        return func(*args, **kwargs)


@contextmanager
def count_host_syncs() -> Iterator[list[str]]:
    """Record, in order, every host synchronisation (see the module docstring) made inside the block.

    Yields:
        A list that fills with the name of each synchronising operation; ``len()`` of it is the count.

    Example:
        >>> x = torch.ones(3)
        >>> with count_host_syncs() as syncs:
        ...     _ = x.sum().item(), x[x > 0], x.tolist()
        >>> syncs
        ['aten::_local_scalar_dense', 'aten::index', 'Tensor.tolist']
    """
    record: list[str] = []
    originals = {name: getattr(torch.Tensor, name) for name in _HOST_READ_METHODS}

    def wrap(name: str, method: Callable) -> Callable:
        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            record.append(f"Tensor.{name}")
            return method(self, *args, **kwargs)

        return counted

    for name, method in originals.items():
        setattr(torch.Tensor, name, wrap(name, method))
    try:
        with _SyncCounter(record):
            yield record
    finally:
        for name, method in originals.items():
            setattr(torch.Tensor, name, method)


class PeakTensorMemory(TorchDispatchMode):
    """Peak bytes of tensor storage created by the operators run inside the block (see the module docstring).

    Example:
        >>> with PeakTensorMemory() as memory:
        ...     y = torch.ones(256) * 2  # two storages of 1 KiB; the first dies at once
        >>> memory.peak_bytes
        2048
    """

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._storages: dict[tuple[int, str], list[int]] = {}  # (data_ptr, device) -> [nbytes, live tensors]

    def _release(self, key: tuple[int, str]) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.live_bytes -= entry[0]
            del self._storages[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliases_an_input = any(ret.alias_info is not None for ret in func._schema.returns)  # a view or in-place
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.untyped_storage().nbytes() == 0:
                continue
            storage = tensor.untyped_storage()
            key = (storage.data_ptr(), str(tensor.device))
            if key not in self._storages:
                if aliases_an_input:  # a view of memory allocated before the block: not the call's
                    continue
                self._storages[key] = [storage.nbytes(), 0]
                self.live_bytes += storage.nbytes()
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            self._storages[key][1] += 1
            weakref.finalize(tensor, self._release, key)
        return out
