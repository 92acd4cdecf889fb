"""A seeded streaming engine on a virtual clock: continuous batching of simulated responses, abort and resume.

The streaming counterpart of :class:`~dapo_verl.sampler.simulation.SimulatedPolicy`, for the sampler's tests and
the streaming benchmark (``benchmarks/bench_stream.py``). It keeps the engine contract of
:mod:`~dapo_verl.sampler.engine` strictly: ``collect`` only while something is in flight, every request answered
once, ``abort`` returns every unfinished group with the tokens its responses hold.

Model. Each response of a request gets, when its group is first submitted, a length and an outcome: the length from
``lengths`` (a draw of at most ``max_response_length`` tokens; a response that would run longer is truncated there
and is wrong, as a response cut off before its answer is), the outcome correct with probability
``pass_rate(prompt_id, step)``. The draws are seeded by ``(seed, prompt_id, step, occurrence)``, so two samplers
that ask for the same prompt at the same step get the same group, whatever else they ask for.

Replicas. The engine has ``replicas`` schedulers, as a rollout of several vLLM servers does. Each response is routed
once, as verl's router routes each trajectory: to a replica with the fewest responses in flight (ties drawn at
random), or, when it resumes, back to the replica it ran on (sticky sessions). A replica decodes its own responses by
continuous batching: every running response gains one token per decode iteration, at most ``max_running`` run at
once and the others wait, first come first served. With a ``kv_capacity`` a replica holds at most that many tokens
of prompts and responses: a waiting response starts only when its prompt, its prefix and one more iteration of
everything running fit, and when an iteration would not fit the replica preempts its last admitted response, which
waits at the front of the queue and pays the prefill of its prompt and prefix again when it restarts (vLLM's
recompute preemption). Replicas run side by side on one virtual clock; a group finishes when its last response does,
wherever that ran.

``abort`` stops everything; a group submitted again with ``Request.resume`` continues each unfinished response from
the tokens it holds, on its replica, with the length and outcome drawn when it began (a simplification: the policy
changed in between), and pays the prefill of its prompt and prefix again, as an engine that rebuilds the KV cache
does.

Time is virtual: a :class:`CostModel` charges each stretch of a replica's decode iterations for the number of
sequences it runs and their context, and each admission for its prefill; :class:`IterationCost` (the default)
counts decode iterations. Nothing sleeps and nothing depends on the machine.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from dapo_verl.sampler.engine import Aborted, Completion, PartialGroup, Request
from dapo_verl.sampler.types import GroupResult

__all__ = ["CostModel", "IterationCost", "LongTailLengths", "ResponsesCodec", "SimulatedEngine"]


class CostModel(Protocol):
    """Virtual time of generation work."""

    def decode_time(self, running: int, context: int, iterations: int) -> float:
        """Time of ``iterations`` decode iterations of ``running`` sequences holding ``context`` tokens at the first
        (each iteration adds ``running`` tokens)."""
        ...

    def prefill_time(self, tokens: int) -> float:
        """Time to prefill ``tokens`` tokens (a prompt, or a prompt and the prefix of a resumed response)."""
        ...


class IterationCost:
    """Counts decode iterations; prefill is free."""

    def decode_time(self, running: int, context: int, iterations: int) -> float:
        return float(iterations)

    def prefill_time(self, tokens: int) -> float:
        return 0.0


class Lengths(Protocol):
    """Draws response lengths for the engine (:class:`LongTailLengths`)."""

    def draw(self, prompt_id: int, seed: int, rng: random.Random) -> float:
        """One response's length, before truncation (tokens, > 0); may draw from ``rng``."""
        ...


@dataclass(frozen=True)
class LongTailLengths:
    """Response lengths shaped like DAPO's: log-normal around a per-prompt median, with a tail past the budget.

    A prompt's median is ``median * exp(prompt_sigma * u)`` with ``u ~ N(0, 1)`` fixed per prompt (responses to
    one prompt have similar lengths); a response's length is that median times ``exp(sigma * e)``, ``e ~ N(0, 1)``.

    Attributes:
        median: Median response length over prompts, tokens.
        sigma: Spread of one prompt's responses (log scale).
        prompt_sigma: Spread of the prompts' medians (log scale).
    """

    median: float
    sigma: float = 0.6
    prompt_sigma: float = 0.5

    def __post_init__(self) -> None:
        for name in ("median", "sigma", "prompt_sigma"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"LongTailLengths.{name}={value!r}; expected a finite number > 0.")

    def draw(self, prompt_id: int, seed: int, rng: random.Random) -> float:
        """One response's length, before truncation (tokens, > 0)."""
        return self.median * math.exp(self.prompt_sigma * _prompt_effect(seed, prompt_id) + self.sigma * rng.gauss())


@functools.lru_cache(maxsize=1 << 16)
def _prompt_effect(seed: int, prompt_id: int) -> float:
    """The prompt's fixed N(0, 1) length effect."""
    return random.Random(hash((seed, prompt_id, -1))).gauss()  # ints only: str hashes differ between processes


@dataclass
class _Response:
    target: int  # tokens it holds when finished
    done: int  # tokens it holds now (while it runs: when it was last admitted)
    correct: bool
    truncated: bool
    replica: int = -1  # where the router sent it; a resumed response goes back there (sticky); -1: not yet routed
    admitted_at: int = 0  # its replica's decode iteration when it last started running


@dataclass
class _Group:
    request: Request
    responses: list[_Response]
    unfinished: int = field(init=False)

    def __post_init__(self) -> None:
        self.unfinished = sum(r.done < r.target for r in self.responses)


class _Replica:
    """One engine replica's scheduler state: its queue, its running responses, its KV cache and its own clock.

    ``context`` is the KV cache it holds, in tokens: every running response's prompt and tokens so far.
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.time = 0.0  # the virtual time its state is current at
        self.iterations = 0  # decode iterations so far
        self.waiting: deque[tuple[_Group, _Response]] = deque()  # first come first served; preempted at the front
        self.live: dict[int, tuple[_Group, _Response]] = {}  # running responses by admission slot
        self.finishing: list[tuple[int, int, _Group, _Response]] = []  # heap: (finish iteration, slot, ...), lazy
        self.newest: list[int] = []  # heap of -slot: the last admitted first, lazy
        self.context_base = 0  # context = context_base + len(live) * iterations
        self.inflight = 0  # responses routed here and not finished: what the router balances
        self.version = 0  # bumped whenever its next event moves

    @property
    def context(self) -> int:
        return self.context_base + len(self.live) * self.iterations


class SimulatedEngine:
    """A streaming :class:`~dapo_verl.sampler.engine.GenerationEngine` over simulated responses (module docstring).

    Args:
        pass_rate: ``pass_rate(prompt_id, step) -> probability`` of a correct response.
        group_size: G, responses per prompt (1: one response a request, as a serving benchmark sends them).
        lengths: Draws response lengths (:class:`LongTailLengths`, or any :class:`Lengths`).
        max_response_length: The response budget, tokens.
        prompt_tokens: Tokens of each prompt (context and prefill).
        max_running: Most responses decoding at once on one replica (vLLM's ``max_num_seqs``; None: unbounded).
        replicas: Engine replicas; the router sends each response to one (module docstring).
        kv_capacity: KV-cache tokens of one replica (None: unbounded); at least ``prompt_tokens +
            max_response_length + 1``, so that one response alone always fits (vLLM refuses a cache smaller than
            one sequence).
        cost: Charges one replica's virtual time (default :class:`IterationCost`).
        seed: Seed of every draw, and of the router's ties.

    Attributes:
        step: The policy version requests are generated with; the caller sets it before each training step.
        clock: Virtual time so far: the time of the latest event.
        prefill_tokens, tokens_generated, preemptions: Work done so far (``tokens_generated``: response tokens
            decoded, each once; ``prefill_tokens``: prompts, resumed prefixes and preempted responses recomputed).
        sequence_seconds: Running sequences integrated over decode time, summed over replicas.
        codec: Turns the payload of an aborted group into checkpointable data and back (the sampler's ``codec``).
    """

    streaming = True
    resumes_partials = True
    checks_groups = False

    def __init__(
        self,
        pass_rate: Callable[[int, int], float],
        *,
        group_size: int,
        lengths: Lengths,
        max_response_length: int,
        prompt_tokens: int = 0,
        max_running: int | None = None,
        replicas: int = 1,
        kv_capacity: int | None = None,
        cost: CostModel | None = None,
        seed: int = 0,
    ) -> None:
        if (
            group_size < 1
            or max_response_length < 1
            or prompt_tokens < 0
            or (max_running is not None and max_running < 1)
            or replicas < 1
            or (kv_capacity is not None and kv_capacity <= prompt_tokens + max_response_length)
        ):
            raise ValueError(
                f"SimulatedEngine(group_size={group_size}, max_response_length={max_response_length}, "
                f"prompt_tokens={prompt_tokens}, max_running={max_running}, replicas={replicas}, "
                f"kv_capacity={kv_capacity}): expected group_size >= 1, max_response_length >= 1, "
                f"prompt_tokens >= 0, max_running >= 1 or None, replicas >= 1, and kv_capacity None or above "
                f"prompt_tokens + max_response_length ({prompt_tokens + max_response_length}) so that one response "
                f"fits a replica's cache."
            )
        self.pass_rate, self.group_size, self.lengths = pass_rate, group_size, lengths
        self.max_response_length, self.prompt_tokens = max_response_length, prompt_tokens
        self.max_running, self.kv_capacity = max_running, kv_capacity
        self.cost, self.seed = cost or IterationCost(), seed
        self.step = 0
        self.clock = 0.0
        self.prefill_tokens = 0
        self.tokens_generated = 0
        self.preemptions = 0
        self.sequence_seconds = 0.0
        self.codec = ResponsesCodec()
        self._occurrence: dict[tuple[int, int], int] = {}
        self._groups: dict[int, _Group] = {}  # by request id: submitted, not yet returned
        self._replicas = [_Replica(i) for i in range(replicas)]
        self._events: list[tuple[float, int, int]] = []  # heap of (time, replica, its version then)
        self._router = random.Random(f"router-{seed}")
        self._slots = 0

    # -- the engine contract ----------------------------------------------------------------------------------

    def submit(self, requests: Sequence[Request]) -> None:
        touched: dict[int, _Replica] = {}
        for request in requests:
            if request.request_id in self._groups:
                raise ValueError(f"request {request.request_id} is already generating; submit each request once.")
            group = _Group(request, self._resume(request) if request.resume is not None else self._draw(request))
            self._groups[request.request_id] = group
            for r in group.responses:
                if r.done < r.target:
                    replica = self._route(r)
                    replica.waiting.append((group, r))
                    touched[replica.index] = replica
        for replica in touched.values():
            self._catch_up(replica, self.clock)
            self._admit(replica)
            self._schedule(replica)

    def collect(self) -> list[Completion]:
        if not self._groups:
            raise RuntimeError("collect() with nothing in flight: the sampler only collects while groups generate.")
        finished = [g for g in self._groups.values() if g.unfinished == 0]  # e.g. resumed with nothing left
        while not finished:
            finished = self._advance()
        return self._hand_back(finished)

    def run_until(self, when: float) -> list[Completion]:
        """Generate until virtual time ``when`` and return every group finished by then (possibly none): what a
        poller sees when it looks at ``when``, as verl's replay buffer looks every ``poll_interval`` seconds.
        Requests submitted next arrive at ``when``."""
        while (upcoming := self._upcoming()) is not None and upcoming <= when:
            self._advance()
        self.clock = max(self.clock, when)
        return self._hand_back([g for g in self._groups.values() if g.unfinished == 0])

    def abort(self) -> Aborted:
        for replica in self._replicas:
            self._catch_up(replica, self.clock)
            for _, r in replica.live.values():
                gained = replica.iterations - r.admitted_at
                r.done += gained
                self.tokens_generated += gained
            self._replicas[replica.index] = fresh = _Replica(replica.index)
            fresh.time, fresh.iterations, fresh.version = self.clock, replica.iterations, replica.version + 1
        self._events = []
        aborted = Aborted()
        for group in self._groups.values():
            partial = PartialGroup(
                prompt_id=group.request.prompt_id,
                tokens=sum(r.done for r in group.responses),
                finished=sum(r.done >= r.target for r in group.responses),
                group_size=self.group_size,
                payload=[_copy(r) for r in group.responses],
            )
            aborted.partial.append((group.request, partial))
        self._groups = {}
        return aborted

    # -- generation -----------------------------------------------------------------------------------------

    def _draw(self, request: Request) -> list[_Response]:
        key = (request.prompt_id, self.step)
        occurrence = self._occurrence[key] = self._occurrence.get(key, -1) + 1
        rng = random.Random(hash((self.seed, request.prompt_id, self.step, occurrence)))
        p = self.pass_rate(request.prompt_id, self.step)
        responses = []
        for _ in range(self.group_size):
            length = self.lengths.draw(request.prompt_id, self.seed, rng)
            truncated = length >= self.max_response_length
            correct = rng.random() < p and not truncated
            responses.append(_Response(max(1, min(self.max_response_length, round(length))), 0, correct, truncated))
        return responses

    def _resume(self, request: Request) -> list[_Response]:
        assert request.resume is not None
        payload = request.resume.payload
        if not isinstance(payload, list) or not all(isinstance(r, _Response) for r in payload):
            raise ValueError(
                f"request {request.request_id} resumes a partial group whose payload is "
                f"{type(payload).__name__}; resume only what this engine's abort() returned."
            )
        if any(r.replica >= len(self._replicas) for r in payload):
            raise ValueError(
                f"request {request.request_id} resumes responses routed to replica "
                f"{max(r.replica for r in payload)}, but this engine has {len(self._replicas)}; resume a partial "
                f"group on an engine with as many replicas as the one that aborted it."
            )
        return [_copy(r) for r in payload]

    def _route(self, response: _Response) -> _Replica:
        """verl's router (``workers/rollout/router.py``, ``GlobalRequestLoadBalancer.acquire_server``, verl 0.9.1
        lines 170-204): a request it has seen goes back to its replica (sticky sessions: a resumed response keeps
        its replica), a new one to a replica with the fewest requests in flight, ties drawn at random. Each response
        is its own request there (the agent loop draws a uuid per trajectory)."""
        if response.replica < 0:
            if len(self._replicas) == 1:
                response.replica = 0
            else:
                fewest = min(replica.inflight for replica in self._replicas)
                response.replica = self._router.choice([r.index for r in self._replicas if r.inflight == fewest])
        replica = self._replicas[response.replica]
        replica.inflight += 1
        return replica

    def _prune(self, replica: _Replica) -> None:
        """Drop the heap entries of responses no longer running (preempted)."""
        while replica.finishing and replica.finishing[0][1] not in replica.live:
            heapq.heappop(replica.finishing)

    def _until_event(self, replica: _Replica) -> int:
        """Decode iterations until the replica's next event: a response finishes, or the next iteration would not
        fit the KV cache."""
        self._prune(replica)
        until = replica.finishing[0][0] - replica.iterations
        if self.kv_capacity is not None:
            until = min(until, max(0, (self.kv_capacity - replica.context) // len(replica.live)))
        return until

    def _schedule(self, replica: _Replica) -> None:
        replica.version += 1
        if replica.live:
            iterations = self._until_event(replica)
            when = replica.time + self.cost.decode_time(len(replica.live), replica.context, iterations)
            heapq.heappush(self._events, (when, replica.index, replica.version))

    def _catch_up(self, replica: _Replica, now: float) -> None:
        """Decode the iterations the replica finished by ``now`` (short of its next event), so that what arrives
        then joins at the right iteration; an idle replica just waits until ``now``."""
        if not replica.live:
            replica.time = max(replica.time, now)
            return
        budget, running, context = now - replica.time, len(replica.live), replica.context
        low, high = 0, self._until_event(replica) - 1  # the largest n <= high whose n iterations end by now
        while low < high:
            mid = (low + high + 1) // 2
            if self.cost.decode_time(running, context, mid) <= budget:
                low = mid
            else:
                high = mid - 1
        if low > 0:
            spent = self.cost.decode_time(running, context, low)
            replica.time += spent
            replica.iterations += low
            self.sequence_seconds += running * spent

    def _admit(self, replica: _Replica) -> None:
        """Start waiting responses, first come first served, while the replica has a free sequence slot and its KV
        cache holds the newcomer's prompt and prefix and one more iteration of everything running; pay their
        prefill. A replica with nothing running admits its first waiting response whatever its size."""
        tokens = 0
        while replica.waiting and (self.max_running is None or len(replica.live) < self.max_running):
            group, r = replica.waiting[0]
            need = self.prompt_tokens + r.done
            if (
                self.kv_capacity is not None
                and replica.live
                and replica.context + need + len(replica.live) + 1 > self.kv_capacity
            ):
                break  # head-of-line blocking, as vLLM's FCFS scheduler
            replica.waiting.popleft()
            self._slots += 1
            r.admitted_at = replica.iterations
            replica.live[self._slots] = (group, r)
            heapq.heappush(replica.finishing, (replica.iterations + r.target - r.done, self._slots, group, r))
            heapq.heappush(replica.newest, -self._slots)
            replica.context_base += need - replica.iterations
            tokens += need
        if tokens:
            self.prefill_tokens += tokens
            replica.time += self.cost.prefill_time(tokens)

    def _stop(self, replica: _Replica, slot: int) -> _Response:
        """Take a running response off the replica, crediting the tokens it decoded since its admission."""
        _, r = replica.live.pop(slot)
        replica.context_base -= self.prompt_tokens + r.done - r.admitted_at
        gained = replica.iterations - r.admitted_at
        r.done += gained
        self.tokens_generated += gained
        return r

    def _preempt(self, replica: _Replica) -> None:
        """Free KV cache until the next iteration fits: vLLM's recompute preemption (vllm 0.27
        ``v1/core/sched/scheduler.py`` ``schedule``, lines 580-625 and ``_preempt_request``: ``self.running.pop()``,
        the last admitted, goes back to the front of the queue, its blocks freed and its prompt and tokens recomputed
        when it is admitted again; line 684: no admission in a step that preempted)."""
        assert self.kv_capacity is not None
        while len(replica.live) > 1 and replica.context + len(replica.live) > self.kv_capacity:
            slot = -heapq.heappop(replica.newest)
            if slot in replica.live:
                group = replica.live[slot][0]
                replica.waiting.appendleft((group, self._stop(replica, slot)))
                self.preemptions += 1

    def _upcoming(self) -> float | None:
        """The time of the earliest pending replica event, dropping the ones a later change made obsolete."""
        while self._events and self._events[0][2] != self._replicas[self._events[0][1]].version:
            heapq.heappop(self._events)
        return self._events[0][0] if self._events else None

    def _advance(self) -> list[_Group]:
        """Run the earliest replica event; return the groups that finished with it."""
        if self._upcoming() is None:
            raise RuntimeError("the simulated engine has groups in flight but nothing running; this is a bug.")
        when, index, _ = heapq.heappop(self._events)
        replica = self._replicas[index]
        replica.iterations += self._until_event(replica)
        self.sequence_seconds += len(replica.live) * (when - replica.time)
        replica.time = when
        self.clock = max(self.clock, when)
        finished = []
        while replica.finishing and replica.finishing[0][0] == replica.iterations:
            _, slot, group, _ = heapq.heappop(replica.finishing)
            if slot not in replica.live:
                continue
            self._stop(replica, slot)
            replica.inflight -= 1
            group.unfinished -= 1
            if group.unfinished == 0:
                finished.append(group)
        before = self.preemptions
        if self.kv_capacity is not None and replica.live:
            self._preempt(replica)
        if self.preemptions == before:  # vLLM admits nothing in a step that preempted
            self._admit(replica)
        self._schedule(replica)
        return finished

    def _hand_back(self, finished: list[_Group]) -> list[Completion]:
        """Answer the finished groups' requests, once each."""
        for group in finished:
            del self._groups[group.request.request_id]
        return [(g.request, self._result(g)) for g in finished]

    def _result(self, group: _Group) -> GroupResult:
        responses = group.responses
        correct = torch.tensor([r.correct for r in responses])
        return GroupResult(
            prompt_id=group.request.prompt_id,
            metric=correct,
            response_lengths=torch.tensor([r.target for r in responses]),
            truncated=torch.tensor([r.truncated for r in responses]),
            scores=correct.to(torch.float32) * 2 - 1,
        )


def _copy(response: _Response) -> _Response:
    return _Response(response.target, response.done, response.correct, response.truncated, response.replica)


class ResponsesCodec:
    """The payload of an aborted simulated group (its responses) as a dict of (G,) tensors, and back.

    A payload written before responses carried their replica decodes as not yet routed."""

    _FIELDS = ("target", "done", "correct", "truncated", "replica")

    def encode(self, payload: Any) -> Any:
        return {name: torch.tensor([getattr(r, name) for r in payload]) for name in self._FIELDS}

    def decode(self, data: Any) -> Any:
        columns = [data[name].tolist() for name in self._FIELDS[:4]]
        replicas = data["replica"].tolist() if "replica" in data else [-1] * len(columns[0])
        return [_Response(int(t), int(d), bool(c), bool(x), int(k)) for t, d, c, x, k in zip(*columns, replicas)]
