"""A seeded streaming engine on a virtual clock: continuous batching of simulated responses, abort and resume.

The streaming counterpart of :class:`~dapo_verl.sampler.simulation.SimulatedPolicy`, for the sampler's tests and
the streaming benchmark (``benchmarks/bench_stream.py``). It keeps the engine contract of
:mod:`~dapo_verl.sampler.engine` strictly: ``collect`` only while something is in flight, every request answered
once, ``abort`` returns every unfinished group with the tokens its responses hold.

Model. Each response of a request gets, when its group is first submitted, a length and an outcome: the length from
``lengths`` (a draw of at most ``max_response_length`` tokens; a response that would run longer is truncated there
and is wrong, as a response cut off before its answer is), the outcome correct with probability
``pass_rate(prompt_id, step)``. The draws are seeded by ``(seed, prompt_id, step, occurrence)``, so two samplers
that ask for the same prompt at the same step get the same group, whatever else they ask for. Every running
response gains one token per decode iteration (continuous batching, as vLLM decodes); at most ``max_running``
responses run at once and the others wait, first come first served. A group finishes when its last response does.
``abort`` stops everything; a group submitted again with ``Request.resume`` continues each unfinished response from
the tokens it holds, with the length and outcome drawn when it began (a simplification: the policy changed in
between), and pays the prefill of its prompt and prefix again, as an engine that rebuilds the KV cache does.

Time is virtual: a :class:`CostModel` charges each stretch of decode iterations for the number of sequences running
and their context, and each admission for its prefill; :class:`IterationCost` (the default) counts decode
iterations. Nothing sleeps and nothing depends on the machine.
"""

from __future__ import annotations

import functools
import heapq
import math
import random
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
    done: int  # tokens it holds now
    correct: bool
    truncated: bool
    admitted_at: int = 0  # the engine's decode iteration when it last started running


@dataclass
class _Group:
    request: Request
    responses: list[_Response]
    unfinished: int = field(init=False)

    def __post_init__(self) -> None:
        self.unfinished = sum(r.done < r.target for r in self.responses)


class SimulatedEngine:
    """A streaming :class:`~dapo_verl.sampler.engine.GenerationEngine` over simulated responses (module docstring).

    Args:
        pass_rate: ``pass_rate(prompt_id, step) -> probability`` of a correct response.
        group_size: G, responses per prompt.
        lengths: Draws response lengths (:class:`LongTailLengths`).
        max_response_length: The response budget, tokens.
        prompt_tokens: Tokens of each prompt (context and prefill).
        max_running: Most responses decoding at once (None: unbounded).
        cost: Charges virtual time (default :class:`IterationCost`).
        seed: Seed of every draw.

    Attributes:
        step: The policy version requests are generated with; the caller sets it before each training step.
        clock: Virtual time so far.
        decode_iterations, prefill_tokens, tokens_generated: Work done so far (``tokens_generated``: response
            tokens decoded, each once).
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
        lengths: LongTailLengths,
        max_response_length: int,
        prompt_tokens: int = 0,
        max_running: int | None = None,
        cost: CostModel | None = None,
        seed: int = 0,
    ) -> None:
        if (
            group_size < 2
            or max_response_length < 1
            or prompt_tokens < 0
            or (max_running is not None and max_running < 1)
        ):
            raise ValueError(
                f"SimulatedEngine(group_size={group_size}, max_response_length={max_response_length}, "
                f"prompt_tokens={prompt_tokens}, max_running={max_running}): expected group_size >= 2, "
                f"max_response_length >= 1, prompt_tokens >= 0 and max_running >= 1 or None."
            )
        self.pass_rate, self.group_size, self.lengths = pass_rate, group_size, lengths
        self.max_response_length, self.prompt_tokens = max_response_length, prompt_tokens
        self.max_running, self.cost, self.seed = max_running, cost or IterationCost(), seed
        self.step = 0
        self.clock = 0.0
        self.decode_iterations = 0
        self.prefill_tokens = 0
        self.tokens_generated = 0
        self.codec = ResponsesCodec()
        self._occurrence: dict[tuple[int, int], int] = {}
        self._groups: dict[int, _Group] = {}  # by request id: submitted, not yet returned
        self._waiting: list[tuple[_Group, _Response]] = []  # first come first served
        self._running: list[tuple[int, int, _Group, _Response]] = []  # heap of (finish iteration, order, ...)
        self._order = 0
        self._context_base = 0  # running context = _context_base + len(_running) * decode_iterations

    # -- the engine contract ----------------------------------------------------------------------------------

    def submit(self, requests: Sequence[Request]) -> None:
        for request in requests:
            if request.request_id in self._groups:
                raise ValueError(f"request {request.request_id} is already generating; submit each request once.")
            group = _Group(request, self._resume(request) if request.resume is not None else self._draw(request))
            self._groups[request.request_id] = group
            self._waiting.extend((group, r) for r in group.responses if r.done < r.target)
        self._admit()

    def collect(self) -> list[Completion]:
        if not self._groups:
            raise RuntimeError("collect() with nothing in flight: the sampler only collects while groups generate.")
        finished = [g for g in self._groups.values() if g.unfinished == 0]  # e.g. resumed with nothing left
        while not finished:
            finished = self._advance()
        for group in finished:
            del self._groups[group.request.request_id]
        return [(g.request, self._result(g)) for g in finished]

    def abort(self) -> Aborted:
        aborted = Aborted()
        for _, _, _, r in self._running:
            r.done += self.decode_iterations - r.admitted_at
            self.tokens_generated += self.decode_iterations - r.admitted_at
        for group in self._groups.values():
            partial = PartialGroup(
                prompt_id=group.request.prompt_id,
                tokens=sum(r.done for r in group.responses),
                finished=sum(r.done >= r.target for r in group.responses),
                group_size=self.group_size,
                payload=[_copy(r) for r in group.responses],
            )
            aborted.partial.append((group.request, partial))
        self._groups, self._waiting, self._running, self._context_base = {}, [], [], 0
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

    @staticmethod
    def _resume(request: Request) -> list[_Response]:
        assert request.resume is not None
        payload = request.resume.payload
        if not isinstance(payload, list) or not all(isinstance(r, _Response) for r in payload):
            raise ValueError(
                f"request {request.request_id} resumes a partial group whose payload is "
                f"{type(payload).__name__}; resume only what this engine's abort() returned."
            )
        return [_copy(r) for r in payload]

    def _admit(self) -> None:
        """Start waiting responses while there is room, paying their prefill."""
        room = len(self._waiting) if self.max_running is None else self.max_running - len(self._running)
        admitted, self._waiting = self._waiting[: max(room, 0)], self._waiting[max(room, 0) :]
        tokens = 0
        for group, r in admitted:
            r.admitted_at = self.decode_iterations
            self._order += 1
            heapq.heappush(self._running, (self.decode_iterations + r.target - r.done, self._order, group, r))
            self._context_base += self.prompt_tokens + r.done - self.decode_iterations
            tokens += self.prompt_tokens + r.done
        if tokens:
            self.prefill_tokens += tokens
            self.clock += self.cost.prefill_time(tokens)

    def _advance(self) -> list[_Group]:
        """Decode until the next response finishes; return the groups that finished with it."""
        finish = self._running[0][0]
        iterations = finish - self.decode_iterations
        running = len(self._running)
        self.clock += self.cost.decode_time(running, self._context_base + running * self.decode_iterations, iterations)
        self.decode_iterations = finish
        finished = []
        while self._running and self._running[0][0] == finish:
            _, _, group, r = heapq.heappop(self._running)
            self._context_base -= self.prompt_tokens + r.done - r.admitted_at
            self.tokens_generated += r.target - r.done
            r.done = r.target
            group.unfinished -= 1
            if group.unfinished == 0:
                finished.append(group)
        self._admit()
        return finished

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
    return _Response(response.target, response.done, response.correct, response.truncated)


class ResponsesCodec:
    """The payload of an aborted simulated group (its responses) as a dict of (G,) tensors, and back."""

    _FIELDS = ("target", "done", "correct", "truncated")

    def encode(self, payload: Any) -> Any:
        return {name: torch.tensor([getattr(r, name) for r in payload]) for name in self._FIELDS}

    def decode(self, data: Any) -> Any:
        columns = [data[name].tolist() for name in self._FIELDS]
        return [_Response(int(t), int(d), bool(c), bool(x)) for t, d, c, x in zip(*columns)]
