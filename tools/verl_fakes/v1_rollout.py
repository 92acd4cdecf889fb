"""verl v1's agent loop over a real TransferQueue, with only the model simulated.

Used with :mod:`tools.verl_fakes.v1_trainer` (verl's v1 trainer without workers) by
``tests/integration/test_v1_sampler_tq.py`` and :mod:`benchmarks.bench_v1_sampler` to drive replay buffers --
verl's own ``ReplayBuffer`` / ``ReplayBufferAsync`` and dapo_verl's ``DapoReplayBuffer`` -- the way verl 0.9.1
drives them, on CPU. What touches TransferQueue (TQ) is verl's own code, apart from the opt-in batched writer:

* :class:`SimulatedRollout` stands in for ``AgentLoopManagerTQ``. It runs verl's ``AgentLoopWorkerTQ`` code
  (``generate_sequences``, ``_run_prompt``, ``_agent_loop_postprocess``) on an event loop, so prompt status
  (``running``, then ``finished`` once every session is written), trajectory keys ``{uid}_{session}_{i}``,
  their values and tags reach TQ exactly as verl writes them. Only ``_run_agent_loop`` (the model call and
  the reward) is simulated: :class:`~dapo_verl.sampler.simulation.SimulatedPolicy` draws each group's
  correctness from ``pass_rate(prompt index, step)`` and its response lengths, seeded per (prompt, step,
  occurrence), so a group's outcome does not depend on thread timing and a resumed run draws what an
  uninterrupted one draws. ``writer="batched"`` (the benchmark's) writes the same keys, tags and status order
  with one TQ put per group instead of verl's one per session; a test checks that both write the same.

Timing (``SimulatedRollout(timing=...)``):

* ``"thread"``: the event loop runs in a background thread, as in the agent-loop worker's process; a group
  finishes ``latency x latency_scale_s`` seconds after dispatch. Tests use it.
* ``"virtual"``: generation advances only when a buffer sleeps between polls (verl's ``_wait_for_next_poll``,
  dapo_verl's ``v1_groups.wait_terminal``); each sleep advances a virtual clock by ``tick`` generation budgets and
  completes every group that is due, so what a buffer sees is deterministic and independent of machine
  load. The benchmark uses it. Latencies are bench_sampler's assumption: a group finishes ``U(0.5, 1)``
  budgets after dispatch.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
import transfer_queue as tq
from omegaconf import DictConfig
from verl.experimental.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics
from verl.trainer.ppo.v1 import replay_buffer as verl_replay_buffer
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from dapo_verl.adapter import v1_groups
from dapo_verl.sampler.simulation import LATENCY_SEED_OFFSET, SimulatedPolicy, group_latencies

__all__ = ["SimulatedRollout", "clear_all", "train_keys"]

_VerlWorker = AgentLoopWorkerTQ.__ray_actor_class__  # the class under @ray.remote: its methods run in-process
_SEED_MIX = 1_000_003


def train_keys(partition_id: str = "train") -> dict[str, dict]:
    """Every key of a TQ partition with its tag (``{}`` when empty)."""
    return (tq.kv_list(partition_id=partition_id) or {}).get(partition_id, {})


@dataclass
class _Group:
    """One dispatched prompt: its simulated outcome and where it is in time."""

    index: int
    step: int
    correct: list[bool]
    lengths: list[int]
    latency: float
    dispatch_seq: int
    dispatch_time: float
    completion_seq: int | None = None
    completion_time: float | None = None
    gate: Any = None
    started: Any = None
    done: Any = None
    aborted: bool = False


class _SimulatedWorker(_VerlWorker):
    """verl's ``AgentLoopWorkerTQ`` with the model call replaced by the simulated policy.

    No ``super().__init__``: it would start rollout servers. The attributes set here are the ones verl's
    ``_agent_loop_postprocess`` reads; with no processor, no reward-loop workers and no distillation its own
    code computes position ids, keeps the given reward and writes to TQ.
    """

    def __init__(self, rollout: SimulatedRollout, config: DictConfig) -> None:
        self.rollout = rollout
        self.config = config
        self.processor = None
        self.tokenizer = None
        self.reward_loop_worker_handles = None
        self.distillation_enabled = False
        self.background_tasks = set()

    async def _run_prompt(self, prompt: dict, sampling_params: dict, trajectory: dict, trace: bool = False) -> None:
        try:
            if self.rollout.writer == "verl":
                await super()._run_prompt(prompt, sampling_params, trajectory=trajectory, trace=trace)
            else:
                await self._run_prompt_batched(prompt, trajectory)
        finally:
            self.rollout._completed(prompt["uid"])

    async def _run_agent_loop(
        self, sampling_params: dict, trajectory: dict, *, agent_name: str, trace: bool = True, **kwargs: Any
    ) -> Any:
        group = await self.rollout._generation(kwargs["uid"])
        output = self.rollout._output(group, int(kwargs["session_id"]))
        return await self._agent_loop_postprocess(output, trajectory["validate"], **kwargs)

    async def _run_prompt_batched(self, prompt: dict, trajectory: dict) -> None:
        """``writer="batched"``: what verl's ``_run_prompt`` writes, with one TQ put for all of a group's sessions.

        Same keys, tags and order (``running``; every trajectory; ``finished``); the values hold the output's
        fields and the prompt's ``uid``, ``index``, ``session_id`` and ``global_steps``.
        """
        uid, partition = prompt["uid"], "val" if trajectory["validate"] else "train"
        await tq.async_kv_put(key=uid, partition_id=partition, tag={"status": "running"})
        group = await self.rollout._generation(uid)
        keys, fields, tags = [], [], []
        for session in range(len(group.correct)):
            output = self.rollout._output(group, session)
            value = output.as_dict()
            value.update(uid=uid, index=prompt["index"], session_id=session, global_steps=prompt["global_steps"])
            prompt_len, response_len = value["prompts"].size(0), value["responses"].size(0)
            keys.append(f"{uid}_{session}_0")
            fields.append(value)
            tags.append(
                {
                    "status": "success",
                    "prompt_len": prompt_len,
                    "response_len": response_len,
                    "seq_len": prompt_len + response_len,
                    "global_steps": prompt["global_steps"],
                    "min_global_steps": value["extra_fields"].get("min_global_steps"),
                    "max_global_steps": value["extra_fields"].get("max_global_steps"),
                }
            )
        await tq.async_kv_batch_put(
            keys=keys, fields=list_of_dict_to_tensordict(fields), tags=tags, partition_id=partition
        )
        await tq.async_kv_put(key=uid, partition_id=partition, tag={"status": "finished"})


class SimulatedRollout:
    """Stands in for ``AgentLoopManagerTQ`` (see the module docstring).

    Args:
        config: The trainer config (``actor_rollout_ref.rollout.{n, val_kwargs.n, response_length}``, ...).
        pass_rate: ``pass_rate(prompt_index, step) -> probability`` that a response is correct.
        seed: Seed of every group's draws.
        timing: ``"thread"`` or ``"virtual"`` (module docstring).
        latency_scale_s: Thread timing: seconds per generation budget.
        tick: Virtual timing: budgets the clock advances per buffer poll.
        writer: ``"verl"`` runs verl's ``_run_prompt`` (one TQ put per session); ``"batched"`` writes the same keys,
            tags and status order with one put per group (faster; for the benchmark).

    Attributes:
        step: The policy version (0-based training step) generating now; the trainer sets it each step.
        groups: Every dispatched prompt by uid, in dispatch order.
        dispatches: The size of every ``generate_sequences`` call, in order.
        now: Virtual time in generation budgets (virtual timing).
        rollout_s: Wall seconds spent in the simulated rollout (dispatch and, with virtual timing, completion).
    """

    def __init__(
        self,
        config: DictConfig,
        pass_rate: Callable[[int, int], float],
        *,
        seed: int = 0,
        timing: str = "thread",
        latency_scale_s: float = 0.02,
        tick: float = 0.05,
        writer: str = "verl",
    ) -> None:
        if timing not in ("thread", "virtual"):
            raise ValueError(f"timing={timing!r}; expected 'thread' or 'virtual'.")
        if writer not in ("verl", "batched"):
            raise ValueError(f"writer={writer!r}; expected 'verl' or 'batched'.")
        self.writer = writer
        self._keep_aborted = False
        self._rejecting = False  # set by an abort with reject_request until the resume
        self.config = config
        self.pass_rate = pass_rate
        self.seed = seed
        self.timing = timing
        self.latency_scale_s = latency_scale_s
        self.tick = tick
        self.response_length = int(config.actor_rollout_ref.rollout.response_length)
        self.step = 0
        self.now = 0.0
        self.rollout_s = 0.0
        self.groups: dict[str, _Group] = {}
        self.dispatches: list[int] = []
        self._occurrences: Counter = Counter()
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._worker = _SimulatedWorker(self, config)
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()  # thread timing: set while the replicas generate (verl's gate is open)
        self._open.set()
        self._abort = asyncio.Event()  # replaced after each abort; the generations running then wait on the old one
        self._thread: threading.Thread | None = None
        if timing == "thread":
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="simulated-agent-loop")
            self._thread.start()

    # -- AgentLoopManagerTQ's interface --------------------------------------------------------------------

    def generate_sequences(self, batch: Any) -> None:
        """Dispatch ``batch`` to verl's worker code; return once the prompts' tasks are spawned (as verl does)."""
        started = time.perf_counter()
        validate = bool(batch["validate"]) if "validate" in batch else False
        n = self.config.actor_rollout_ref.rollout.val_kwargs.n if validate else self.config.actor_rollout_ref.rollout.n
        self.dispatches.append(len(batch))
        for uid, index in zip(list(batch["uid"]), list(batch["index"]), strict=True):
            self.groups[uid] = self._draw(int(index), int(n))
        coroutine = self._worker.generate_sequences(batch)
        if self._thread is not None:
            asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()
        else:
            self._loop.run_until_complete(coroutine)
            self._settle([])  # the new prompts start (status running) and wait for their completion time
        self.rollout_s += time.perf_counter() - started

    # -- simulated generation ------------------------------------------------------------------------------

    def _draw(self, index: int, n: int) -> _Group:
        occurrence = self._occurrences[(index, self.step)]
        self._occurrences[(index, self.step)] += 1
        key = ((self.seed * _SEED_MIX + index) * _SEED_MIX + self.step) * _SEED_MIX + occurrence
        policy = SimulatedPolicy(
            self.pass_rate, group_size=n, max_response_length=self.response_length, seed=key % (2**62)
        )
        policy.step = self.step
        (drawn,) = policy([index])
        latency = group_latencies(torch.Generator().manual_seed(key % (2**62) + LATENCY_SEED_OFFSET), 1)[0]
        group = _Group(
            index=index,
            step=self.step,
            correct=[bool(c) for c in drawn.metric.tolist()],
            lengths=[int(x) for x in drawn.response_lengths.tolist()],
            latency=latency,
            dispatch_seq=next(self._seq),
            dispatch_time=self.now,
        )
        if self.timing == "virtual":
            group.gate, group.started, group.done = (self._loop.create_future() for _ in range(3))
        return group

    def _output(self, group: _Group, session: int) -> AgentLoopOutput:
        """The agent loop's output for one session: the drawn length, reward and ``reward_extra_info``."""
        correct, length = group.correct[session], group.lengths[session]
        info = {
            "acc": float(correct),
            "score": 1.0 if correct else -1.0,
            "overlong_penalty": 0.0,
            "truncated": float(length >= self.response_length),
        }
        return AgentLoopOutput(
            prompt_ids=[3, 4, 5],
            response_ids=[7] * length,
            response_mask=[1] * length,
            reward_score=info["score"],
            num_turns=2,
            metrics=AgentLoopMetrics(),
            extra_fields={
                "reward_extra_info": info,
                "min_global_steps": group.step + 1,
                "max_global_steps": group.step + 1,
            },
        )

    async def _generation(self, uid: str) -> _Group:
        group = self.groups[uid]
        if self.timing == "thread":
            return await self._timed_generation(group)
        if not group.started.done():
            group.started.set_result(None)
        await group.gate
        return group

    async def _timed_generation(self, group: _Group) -> _Group:
        """Thread timing: generate for the group's latency while the gate is open; an abort either returns what the
        group held (``keep=False``, verl's sync client) or parks it to continue after :meth:`resume`
        (``FullyAsyncLLMServerClient`` in colocate_async). Every session of a group shares its clock."""
        total = remaining = group.latency * self.latency_scale_s
        while True:
            if not self._open.is_set() and self._rejecting:  # verl's server answers a late arrival as aborted
                if not group.aborted:
                    group.aborted = True
                    group.lengths = [0] * len(group.lengths)
                return group
            await self._open.wait()  # parked behind the closed gate, as vLLM parks requests after an abort
            abort, started = self._abort, self._loop.time()
            try:
                await asyncio.wait_for(abort.wait(), timeout=remaining)
            except TimeoutError:
                return group
            remaining = max(remaining - (self._loop.time() - started), 0.0)
            if not self._keep_aborted:
                if not group.aborted:  # what each response held at the abort
                    group.aborted = True
                    group.lengths = [int(length * (1.0 - remaining / total)) for length in group.lengths]
                return group

    def abort(self, *, keep: bool, reject_request: bool = False) -> None:
        """Thread timing: abort every running generation and close the gate (verl's ``abort_replicas``); with
        ``keep`` the aborted generations continue after :meth:`resume`, else they return what they held. With
        ``reject_request`` a generation reaching the closed gate returns at once with nothing generated, as verl's
        server rejects it; without, it parks until :meth:`resume`."""
        if self._thread is None:
            raise NotImplementedError("abort() needs thread timing; virtual timing models no abort.")

        async def close_gate() -> None:
            self._keep_aborted = keep
            self._rejecting = reject_request
            self._open.clear()
            abort, self._abort = self._abort, asyncio.Event()
            abort.set()

        asyncio.run_coroutine_threadsafe(close_gate(), self._loop).result()

    def resume(self) -> None:
        """Open the gate again (verl's ``resume_generation_replicas``)."""

        def open_gate() -> None:
            self._rejecting = False
            self._open.set()

        self._loop.call_soon_threadsafe(open_gate)

    def replicas_sleep(self) -> None:
        """verl's ``sleep_replicas``: refused while a dispatched group is still generating (a real replica would
        free the weights under it)."""
        running = [uid for uid, g in self.groups.items() if g.completion_seq is None]
        if running:
            raise RuntimeError(
                f"sleep_replicas with {len(running)} groups still generating (e.g. {running[0]}); a "
                f"sync trainer must not leave requests in flight when its replicas sleep."
            )

    def _completed(self, uid: str) -> None:
        group = self.groups[uid]
        with self._lock:
            group.completion_seq = next(self._seq)
            group.completion_time = self.now
        if group.done is not None and not group.done.done():
            group.done.set_result(None)

    def sleep(self, _seconds: float = 0.0) -> None:
        """Virtual timing: a buffer's poll sleep -- advance the clock one tick and finish the groups now due."""
        started = time.perf_counter()
        self.now += self.tick
        due = [
            g
            for g in self.groups.values()
            if g.completion_seq is None and g.gate is not None and g.dispatch_time + g.latency <= self.now + 1e-9
        ]
        for group in due:
            if not group.gate.done():
                group.gate.set_result(None)
        self._settle([g.done for g in due])
        self.rollout_s += time.perf_counter() - started

    def _settle(self, futures: list) -> None:
        """Virtual timing: run the event loop until ``futures`` are done and every unfinished prompt waits.

        An unfinished prompt waits for its completion time with its status ``running`` written, so what TQ holds
        between two polls does not depend on scheduling.
        """
        waiting = [g.started for g in self.groups.values() if g.started is not None and not g.started.done()]
        if futures or waiting:
            self._loop.run_until_complete(asyncio.gather(*futures, *waiting))

    @contextlib.contextmanager
    def virtual_time(self) -> Iterator[None]:
        """Virtual timing: make the replay buffers' poll sleeps advance this rollout's clock instead of waiting."""
        shim = types.SimpleNamespace(
            sleep=self.sleep, time=time.time, perf_counter=time.perf_counter, monotonic=time.monotonic
        )
        with mock.patch.object(verl_replay_buffer, "time", shim), mock.patch.object(v1_groups, "time", shim):
            yield

    def advance(self, budgets: float) -> None:
        """Virtual timing: let ``budgets`` of generation time pass outside any buffer (a training step's compute)."""
        for _ in range(round(budgets / self.tick)):
            self.sleep()

    def wait_idle(self, timeout_s: float = 30.0) -> None:
        """Let every dispatched group finish (before a simulated restart, or before closing)."""
        deadline = time.monotonic() + timeout_s
        while any(g.completion_seq is None for g in self.groups.values()):
            if time.monotonic() > deadline:
                raise TimeoutError("simulated rollout still generating after the timeout")
            if self._thread is None:
                self.sleep()
            else:
                time.sleep(0.01)

    def close(self) -> None:
        """Stop and close the event loop."""
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._thread = None
        if not self._loop.is_running():
            self._loop.close()

    # -- accounting ------------------------------------------------------------------------------------------

    def waves(self, since_seq: int, until_seq: int) -> int:
        """Sequential generations a buffer waited for between two sequence numbers (one training step).

        A group that finished in the window and was dispatched before it is in wave 1; a group dispatched in
        the window is in wave ``1 + the highest wave among groups that finished before it was dispatched``.
        The step's waves are the highest wave among groups that finished in the window (0 if none did).
        """
        finished = sorted(
            (
                g
                for g in self.groups.values()
                if g.completion_seq is not None and since_seq <= g.completion_seq < until_seq
            ),
            key=lambda g: g.completion_seq,
        )
        wave: dict[int, int] = {}
        for group in sorted(finished, key=lambda g: g.dispatch_seq):
            if group.dispatch_seq < since_seq:
                wave[group.dispatch_seq] = 1
                continue
            before = [wave.get(g.dispatch_seq, 1) for g in finished if g.completion_seq < group.dispatch_seq]
            wave[group.dispatch_seq] = 1 + max(before, default=0)
        return max(wave.values(), default=0)

    def sequence(self) -> int:
        """The next event sequence number (marks a step's start or end for :meth:`waves`)."""
        with self._lock:
            return next(self._seq)


def clear_all(partitions: Sequence[str] = ("train", "val")) -> None:
    """Remove every key of ``partitions`` from TQ (a fresh process's empty TQ, or a test's cleanup)."""
    for partition in partitions:
        keys = list(train_keys(partition))
        if keys:
            tq.kv_clear(keys=keys, partition_id=partition)
