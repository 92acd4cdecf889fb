"""A weight transport between processes for ``separate_async`` in a CPU rehearsal: verl's checkpoint engine over ZeroMQ.

In ``trainer.v1.trainer_mode=separate_async`` the rollout runs on a pool of its own, and verl moves the actor's
weights to it through a checkpoint engine (``verl/checkpoint_engine``): ``nccl``, ``hccl``, ``nixl``, ``mooncake``
or ``kimi``, all of which need GPUs, NPUs or RDMA, while ``naive`` (in-process) is refused there
(``verl/trainer/ppo/v1/trainer_separate_async.py``). This engine, registered in verl's own
``CheckpointEngineRegistry`` as :data:`CPU_CHECKPOINT_BACKEND` by the rehearsal's CPU plugin only, implements the
same protocol over TCP sockets:

* ``prepare``: every worker binds a socket and reports its address; the actor's rank 0 is the sender;
* ``build_topology``: the actor's rank 0 sends, the other actor ranks only drain their weight stream (FSDP gathers
  collectively), every rollout worker receives;
* ``send_weights``: the sender waits for every receiver, then sends the tensors in buckets of
  ``checkpoint_engine.update_weights_bucket_megabytes`` (a tensor larger than a bucket goes alone);
* ``receive_weights``: yields ``(name, tensor)`` pairs to verl's ``ServerAdapter.update_weights``, which pushes
  them into vLLM as in the colocated modes;
* ``finalize``: closes the sockets.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Generator
from typing import Any

import ray
import torch
import zmq
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

__all__ = ["CPU_CHECKPOINT_BACKEND", "ZmqCheckpointEngine"]

CPU_CHECKPOINT_BACKEND = "dapo_zmq"
"""``actor_rollout_ref.rollout.checkpoint_engine.backend`` of the rehearsal's transport."""

_READY, _SENDER, _RECEIVER, _IDLE = b"ready", "sender", "receiver", "idle"


def _cpu_tensor(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu").contiguous()


def _tensor(data: bytes, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


@CheckpointEngineRegistry.register(CPU_CHECKPOINT_BACKEND)
class ZmqCheckpointEngine(CheckpointEngine):
    """verl checkpoint engine over ZeroMQ (see the module docstring).

    Args:
        bucket_size: Bytes per message (verl passes ``update_weights_bucket_megabytes << 20``).
    """

    def __init__(self, bucket_size: int, **kwargs: Any) -> None:
        self.bucket_size = int(bucket_size)
        self._context = zmq.Context.instance()
        self._socket: zmq.Socket | None = None
        self._role = _IDLE
        self._receivers = 0

    def prepare(self) -> dict[str, Any]:
        self.finalize()
        self._socket = self._context.socket(zmq.ROUTER)
        port = self._socket.bind_to_random_port(f"tcp://{ray.util.get_node_ip_address()}")
        return {"address": f"tcp://{ray.util.get_node_ip_address()}:{port}"}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        master = metadata[0]["address"]  # actor rank 0, the first of the metadata verl gathered
        actor = {
            "role": [_SENDER] + [_IDLE] * (actor_wg_world_size - 1),
            "master": [master] * actor_wg_world_size,
            "receivers": [rollout_world_size] * actor_wg_world_size,
        }
        rollout = {
            "role": [_RECEIVER] * rollout_world_size,
            "master": [master] * rollout_world_size,
            "receivers": [rollout_world_size] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, role: str, master: str, receivers: int) -> None:
        self._role, self._receivers = role, int(receivers)
        if role == _SENDER:
            return  # keeps the socket prepare() bound: receivers connect to it
        self.finalize()
        if role == _RECEIVER:
            self._socket = self._context.socket(zmq.DEALER)
            self._socket.connect(master)

    def finalize(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    async def send_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None
    ) -> dict[str, Any]:
        if self._role != _SENDER:
            for _ in weights:  # every rank takes part in FSDP's gathers
                pass
            return {}
        assert self._socket is not None
        peers = [self._socket.recv_multipart()[0] for _ in range(self._receivers)]
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in weights:
            tensor = _cpu_tensor(tensor)
            if bucket and size + tensor.numel() * tensor.element_size() > self.bucket_size:
                self._send(peers, bucket, last=False)
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
        self._send(peers, bucket, last=True)
        return {}

    def _send(self, peers: list[bytes], bucket: list[tuple[str, torch.Tensor]], *, last: bool) -> None:
        assert self._socket is not None
        header = json.dumps(
            {"last": last, "tensors": [(n, list(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in bucket]}
        ).encode()
        payload = [t.view(torch.uint8).reshape(-1).numpy() if t.numel() else b"" for _, t in bucket]
        for peer in peers:
            self._socket.send_multipart([peer, header, *payload], copy=False)

    async def receive_weights(self, global_steps: int | None = None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        assert self._role == _RECEIVER and self._socket is not None, "receive_weights before init_process_group"
        self._socket.send(_READY)
        while True:
            header, *payload = self._socket.recv_multipart()
            message = json.loads(header)
            for (name, shape, dtype), data in zip(message["tensors"], payload):
                yield name, _tensor(data, getattr(torch, dtype), shape)
            if message["last"]:
                return
