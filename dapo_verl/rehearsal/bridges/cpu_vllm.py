"""verl's own vLLM rollout in a CPU rehearsal: the bridges in the rehearsal's processes, none an edit of verl or vLLM.

Two entry points, both inert outside a rehearsal (``VERL_PLATFORM=cpu`` and the run's record folder in
``DAPO_REHEARSAL_RECORD_DIR``, which only ``dapo-verl rehearse`` sets for its own processes):

* :func:`register` is a **vLLM general plugin**, declared only by the private dist-info a rehearsal puts on its
  processes' path (:func:`dapo_verl.rehearsal.engine.write_private_site`), so vLLM loads it in each of its
  processes there (API server, EngineCore, worker) and nowhere else. It keeps weights reloadable: vLLM-CPU
  repacks linear weights for oneDNN after loading and replaces ``layer.weight`` with an empty parameter
  (``vllm/model_executor/layers/utils.py``), so verl's first weight push fails (``'Parameter' object has no
  attribute 'weight_loader'``) and hangs; with ``_supports_onednn`` off vLLM keeps plain ``F.linear``.
* :func:`install_verl_side` runs from the CPU plugin (:mod:`.cpu_plugin`) in verl's processes.

Both also put verl's weight-transfer socket in the run's private folder (``DAPO_REHEARSAL_SOCKET_DIR``): verl
names it ``/tmp/rl-colocate-zmq-<ray job id>-replica-<r>-rank-<k>.sock``, and two Ray clusters on one machine --
a rehearsal's first and resume runs overlap -- both number their first job ``01000000``, so the two runs would
bind the same path and could exchange weights. Both record the shared memory their process creates
(:mod:`.cpu_leftovers`), and the vLLM side records which vLLM ran (``engine-<pid>.json``) for the report.

In verl's processes, besides: each request to vLLM gets a seed from its content (:mod:`.request_seeds`), so a
resumed run regenerates the uninterrupted run's groups, and, with ``engine_kwargs.dapo_cpu.response_lengths=
long_tail``, a DAPO-like length drawn with that seed (:mod:`.response_lengths`); every request is recorded
(:data:`REQUESTS`: when it started and ended, with which weights, how many tokens), so generation can be counted at
the engine whichever sampler asked for it; and the weight-sync probe of :mod:`.weight_probe` runs around every
weight push and on the engine's first request after it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from dapo_verl.rehearsal.bridges import cpu_leftovers, weight_probe
from dapo_verl.rehearsal.bridges.import_patches import is_patched, mark, patch_on_import
from dapo_verl.rehearsal.bridges.request_seeds import RequestSeeds
from dapo_verl.rehearsal.bridges.response_lengths import length_shape, shape_vllm_request

__all__ = ["RECORD_ENV", "REQUESTS", "SOCKET_ENV", "active", "install_verl_side", "register"]

RECORD_ENV = "DAPO_REHEARSAL_RECORD_DIR"
"""The run's record folder (engine records, shared-memory names, weight-sync probes); set by the rehearsal."""
SOCKET_ENV = "DAPO_REHEARSAL_SOCKET_DIR"
"""The run's private folder for sockets (short: a socket path must fit in 107 bytes); set by the rehearsal."""

_VLLM_UTILS = "verl.workers.rollout.vllm_rollout.utils"
_VLLM_ROLLOUT = "verl.workers.rollout.vllm_rollout.vllm_rollout"
_VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
_TMP_SOCKET = "ipc:///tmp/"


def active() -> Path | None:
    """The run's record folder when this process belongs to a CPU rehearsal, else None."""
    if os.environ.get("VERL_PLATFORM", "").strip().lower() != "cpu":
        return None
    value = os.environ.get(RECORD_ENV, "").strip()
    return Path(value) if value else None


def _private_socket(handle: str) -> str:
    folder = os.environ.get(SOCKET_ENV, "").strip()
    if not folder or not handle.startswith(_TMP_SOCKET):
        return handle
    return f"ipc://{folder}/{handle[len(_TMP_SOCKET) :]}"


# -- vLLM's processes ---------------------------------------------------------------------------------------


def register() -> None:
    """The vLLM general plugin of a CPU rehearsal (see the module docstring); does nothing outside one."""
    record_dir = active()
    if record_dir is None:
        return
    import vllm
    import vllm._custom_ops as ops
    from vllm.platforms import current_platform

    ops._supports_onednn = False
    cpu_leftovers.track(record_dir)
    patch_on_import(_VLLM_UTILS, _patch_receiver_socket)
    from importlib.metadata import version

    record = {
        "pid": os.getpid(),
        "argv0": sys.argv[0],
        "vllm": vllm.__version__,
        "distribution": version("vllm"),
        "device": str(current_platform.device_type),
        "onednn": ops._supports_onednn,
    }
    (record_dir / f"engine-{os.getpid()}.json").write_text(json.dumps(record))


def _patch_receiver_socket(module: ModuleType) -> None:
    extension = module.vLLMColocateWorkerExtension
    original = extension._get_zmq_handle
    if is_patched(original):
        return

    @functools.wraps(original)
    def _get_zmq_handle(self: Any) -> str:
        return _private_socket(original(self))

    extension._get_zmq_handle = mark(_get_zmq_handle)


# -- verl's processes ---------------------------------------------------------------------------------------


def install_verl_side() -> bool:
    """Install the bridges of verl's processes in a CPU rehearsal; return whether it is one."""
    record_dir = active()
    if record_dir is None:
        return False
    cpu_leftovers.track(record_dir)
    patch_on_import(_VLLM_ROLLOUT, functools.partial(_patch_server_adapter, record_dir=record_dir))
    patch_on_import(_VLLM_SERVER, functools.partial(_patch_http_server, record_dir=record_dir))
    return True


def _full_cpu_tensor(tensor: Any) -> Any:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu", copy=True)


def _patch_server_adapter(module: ModuleType, record_dir: Path) -> None:
    adapter = module.ServerAdapter
    if is_patched(adapter.update_weights):
        return
    original_init, original_update = adapter.__init__, adapter.update_weights

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.zmq_handle = _private_socket(self.zmq_handle)

    @functools.wraps(original_update)
    async def update_weights(
        self: Any, weights: Any, global_steps: int | None = None, wire_format: str = "named_tensors", **kwargs: Any
    ) -> Any:
        probe = wire_format == "named_tensors" and getattr(self, "_has_server", False)
        sent: dict[str, Any] = {}

        def kept(stream: Any) -> Any:
            for name, tensor in stream:
                sent[name] = _full_cpu_tensor(tensor)
                yield name, tensor

        async def kept_async(stream: Any) -> Any:  # a checkpoint engine's receive_weights (separate_async)
            async for name, tensor in stream:
                sent[name] = _full_cpu_tensor(tensor)
                yield name, tensor

        if probe:
            weights = kept_async(weights) if hasattr(weights, "__aiter__") else kept(weights)
        result = await original_update(self, weights, global_steps=global_steps, wire_format=wire_format, **kwargs)
        if probe:
            reference = weight_probe.reference_decode(self.model_config.local_path, sent)
            weight_probe.append_record(
                record_dir,
                weight_probe.REFERENCE_RECORDS,
                {"global_steps": global_steps, "replica": self.replica_rank, **reference},
            )
        return result

    adapter.__init__ = mark(__init__)
    adapter.update_weights = mark(update_weights)


def _patch_http_server(module: ModuleType, record_dir: Path) -> None:
    server = module.vLLMHttpServer
    if is_patched(server.generate):
        return
    original_generate, original_launch, original_clear = server.generate, server.launch_server, server.clear_kv_cache
    original_park = server._park_until_admitted  # verl's gate: a request waits there while generation is paused

    async def probe(self: Any, when: str) -> None:
        state = _probe_state(self)
        output = await original_generate(
            self,
            list(weight_probe.PROBE_PROMPT),
            dict(weight_probe.PROBE_SAMPLING),
            f"dapo-weight-probe-{uuid.uuid4().hex}",
        )
        state["seq"] += 1
        weight_probe.append_record(
            record_dir,
            weight_probe.ENGINE_RECORDS,
            {
                "when": when,
                "seq": state["seq"],
                "global_steps": self.global_steps,
                "replica": self.replica_rank,
                "tokens": list(output.token_ids),
                "log_probs": list(output.log_probs or []),
            },
        )

    @functools.wraps(original_launch)
    async def launch_server(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original_launch(self, *args, **kwargs)
        if self.node_rank == 0:
            await probe(self, "started")
        return result

    @functools.wraps(original_clear)
    async def clear_kv_cache(self: Any) -> Any:
        result = await original_clear(self)
        _probe_state(self)["pending"] = True  # verl clears the cache after every weight push
        return result

    @functools.wraps(original_generate)
    async def generate(
        self: Any, prompt_ids: Any, sampling_params: dict[str, Any], request_id: str, *args: Any, **kwargs: Any
    ) -> Any:
        state = _probe_state(self)
        if state["pending"] and self.node_rank == 0:
            # The probe runs alone: vLLM-CPU samples a batch with its per-request generators only when every
            # request in it has one (topk_topp_sampler.forward_cpu), and the greedy probe has none.
            async with state["lock"]:
                if state["pending"]:
                    await probe(self, "after_push")
                    state["pending"] = False
        params = dict(sampling_params)
        if "seed" not in params:
            if state["weights"] != self.global_steps:
                state["weights"] = self.global_steps
                state["seeds"].restart()
            # vLLM seeds its engine once; a seed per request from its content makes a group independent of the
            # order requests arrive in (dapo_verl.rehearsal.bridges.request_seeds). vLLM takes a signed 64-bit seed.
            params["seed"] = state["seeds"].next(list(prompt_ids), params, self.global_steps) >> 1
        if state["lengths"] is not None:  # engine_kwargs.dapo_cpu.response_lengths=long_tail
            shape_vllm_request(params, state["lengths"], prompt_ids, self.config)
        arrived, weights = time.time(), self.global_steps
        try:
            output = await original_generate(self, prompt_ids, params, request_id, *args, **kwargs)
        finally:
            # From admission, not arrival: a request that waited behind the closed gate (colocate_async continues
            # its aborted requests at once, and they wait out the training step) generated nothing while it waited,
            # and generated with the weights it was admitted under. Popped even when generation raised.
            started, weights = state["admitted"].pop(request_id, (arrived, weights))
        _record_request(record_dir, started, weights, len(output.token_ids))
        return output

    @functools.wraps(original_park)
    async def park_until_admitted(self: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        result = await original_park(self, request_id, *args, **kwargs)
        _probe_state(self)["admitted"][request_id] = (time.time(), self.global_steps)
        return result

    server.launch_server = mark(launch_server)
    server.clear_kv_cache = mark(clear_kv_cache)
    server.generate = mark(generate)
    server._park_until_admitted = mark(park_until_admitted)


REQUESTS = "requests-{pid}.jsonl"
"""Per server process: one line per generate request -- when verl's gate admitted it and when it ended, the weights'
global step it was admitted under, tokens."""


def _record_request(record_dir: Path, started: float, weights: Any, tokens: int) -> None:
    line = json.dumps({"start": started, "end": time.time(), "weights": weights, "tokens": tokens})
    with open(record_dir / REQUESTS.format(pid=os.getpid()), "a") as sink:
        sink.write(line + "\n")


def _probe_state(server: Any) -> dict[str, Any]:
    state = server.__dict__.get("_dapo_rehearsal")
    if state is None:
        seed = int(server.config.seed or 0) + int(server.replica_rank)  # vLLM's own engine seed
        state = {
            "seq": 0,
            "pending": False,
            "lock": asyncio.Lock(),
            "seeds": RequestSeeds(seed),
            "weights": object(),
            "lengths": length_shape(server.config),
            "admitted": {},
        }
        server.__dict__["_dapo_rehearsal"] = state
    return state
