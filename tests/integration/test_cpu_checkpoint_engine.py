"""The rehearsal's ZeroMQ checkpoint engine speaks verl's checkpoint-engine protocol: every tensor arrives whole.

Driven as verl's ``CheckpointEngineManager`` drives a backend (``prepare`` on every worker, the class's
``build_topology``, ``init_process_group`` with its per-worker arguments, ``send_weights`` on the actor side and
``receive_weights`` on every rollout worker at once, ``finalize``), with the receivers in threads of their own, as
they are separate processes in a run.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

pytestmark = pytest.mark.verl


def _receive(engine, out: list) -> None:
    async def drain():
        return [(name, tensor.clone()) async for name, tensor in engine.receive_weights(global_steps=3)]

    out.extend(asyncio.run(drain()))


def test_every_tensor_reaches_every_receiver_in_buckets():
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    from dapo_verl.rehearsal.bridges.cpu_checkpoint_engine import CPU_CHECKPOINT_BACKEND, ZmqCheckpointEngine

    assert CheckpointEngineRegistry.get(CPU_CHECKPOINT_BACKEND) is ZmqCheckpointEngine
    generator = torch.Generator().manual_seed(0)
    weights = {
        "embed.weight": torch.randn(8, 4, generator=generator),
        "big": torch.randn(64, generator=generator),  # 256 bytes: over a 100-byte bucket, sent alone
        "empty": torch.empty(0),
        "half": torch.randn(3, 2, generator=generator).to(torch.bfloat16),
        "count": torch.arange(5),
    }
    actors = [ZmqCheckpointEngine(bucket_size=100) for _ in range(2)]  # two FSDP ranks: rank 0 sends
    rollouts = [ZmqCheckpointEngine(bucket_size=100) for _ in range(2)]
    metadata = [engine.prepare() for engine in [*actors, *rollouts]]
    actor_kwargs, rollout_kwargs = ZmqCheckpointEngine.build_topology(2, 2, metadata)
    for group, kwargs in ((actors, actor_kwargs), (rollouts, rollout_kwargs)):
        assert all(len(values) == len(group) for values in kwargs.values())  # verl asserts this
        for rank, engine in enumerate(group):
            engine.init_process_group(**{key: values[rank] for key, values in kwargs.items()})
    received: list[list] = [[], []]
    threads = [threading.Thread(target=_receive, args=(engine, out)) for engine, out in zip(rollouts, received)]
    for thread in threads:
        thread.start()
    asyncio.run(actors[1].send_weights(iter(list(weights.items()))))  # drains its stream, sends nothing
    assert asyncio.run(actors[0].send_weights(iter(weights.items()), global_steps=3)) == {}
    for thread in threads:
        thread.join(timeout=30)
    for out in received:
        assert [name for name, _ in out] == list(weights)
        for name, tensor in out:
            assert tensor.dtype == weights[name].dtype and torch.equal(tensor, weights[name]), name
    for engine in [*actors, *rollouts]:
        engine.finalize()
