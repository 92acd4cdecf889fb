"""The generation engine the batch replenisher drives: submit groups, collect them as they finish, abort the rest.

One contract for every backend. :class:`~dapo_verl.sampler.BatchReplenisher` submits :class:`Request` s (a fresh
prompt, or an aborted group to continue), collects finished groups as the engine reports them, tops up what is in
flight as groups are dropped, and aborts what is still generating once the batch is full. An engine answers three
calls:

* ``submit(requests)`` starts G responses for each request and returns at once.
* ``collect()`` blocks until at least one submitted group has finished and returns every group finished since the
  last call, each once, as ``(request, group)`` pairs. It is only called while something is in flight.
* ``abort()`` stops everything still generating and returns an :class:`Aborted`: the groups that finished but were
  not collected yet, and the partial state of each unfinished one (:class:`PartialGroup`: its responses' tokens so
  far, kept opaque in ``payload``), which the sampler may carry and submit again at a later step
  (``Request.resume``). The engine continues a resumed group from its prefix within the remaining response budget.

An engine also declares three attributes the replenisher reads (:class:`GenerationEngine`): ``streaming`` (false
when its groups finish a round at a time: the replenisher then sizes rounds, and ``stream_oversample`` does not
apply), ``resumes_partials`` (false when it cannot continue an aborted group: the replenisher then drops its aborted
groups as ``discarded`` whatever ``surplus`` says) and ``checks_groups`` (true when ``collect`` already checked its
groups against the contract, so the replenisher does not check them twice).

Round-based generation is the special case of an engine whose ``collect`` generates everything submitted at once
and that never has anything left to abort: :class:`RoundEngine` adapts the replenisher's documented round-based
``generate`` callback (:class:`~dapo_verl.sampler.types.GenerateFn`), and the legacy verl trainer, whose blocking
``generate_sequences`` returns whole rounds, uses it. With a round engine the replenisher generates exactly the
rounds it always did.

Ages: a request carries ``born_step``, the training step whose generation produced its oldest token (the step it
was first submitted in). A group resumed in a later step keeps it, so the staleness bound
(``max_staleness_steps``) holds on every token it trains on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dapo_verl.sampler.contracts import checked_groups
from dapo_verl.sampler.types import GroupResult

__all__ = ["Aborted", "Completion", "GenerationEngine", "PartialGroup", "Request", "RoundEngine", "as_engine"]


@dataclass(frozen=True)
class PartialGroup:
    """A group aborted before all its responses finished.

    Attributes:
        prompt_id: Index of the prompt in the prompt source.
        tokens: Response tokens its G responses hold so far (all of them, earlier segments included).
        finished: Responses that had finished when it was aborted.
        group_size: G.
        payload: Engine data to continue from (token ids, rollout log-probs, the policy version of each token...);
            the sampler only stores it (and encodes it with its codec for checkpoints).
    """

    prompt_id: int
    tokens: int
    finished: int
    group_size: int
    payload: Any = None


@dataclass(frozen=True)
class Request:
    """One group the sampler asks an engine to generate.

    Attributes:
        request_id: Unique among the sampler's requests (the sampler numbers them).
        prompt_id: Index of the prompt in the prompt source.
        born_step: The training step whose generation produced the group's oldest token.
        resume: The aborted group to continue, or None for a fresh prompt.
    """

    request_id: int
    prompt_id: int
    born_step: int
    resume: PartialGroup | None = None

    @property
    def prefix_tokens(self) -> int:
        """Response tokens generated before this request (0 for a fresh prompt)."""
        return 0 if self.resume is None else self.resume.tokens


Completion = tuple[Request, GroupResult]
"""A finished group and the request it answers."""


@dataclass
class Aborted:
    """What :meth:`GenerationEngine.abort` returns: finished groups not collected yet, and unfinished ones."""

    finished: list[Completion] = field(default_factory=list)
    partial: list[tuple[Request, PartialGroup]] = field(default_factory=list)


@runtime_checkable
class GenerationEngine(Protocol):
    """Submits, collects and aborts groups, and says how (module docstring)."""

    streaming: bool
    """Groups finish one at a time (false: a round at a time, and the replenisher sizes rounds)."""

    resumes_partials: bool
    """An aborted group can be submitted again as ``Request.resume`` and continued from its prefix."""

    checks_groups: bool
    """``collect`` returns groups already checked against the contract (:func:`~dapo_verl.sampler.contracts.
    checked_groups`); false: the replenisher checks them."""

    def submit(self, requests: Sequence[Request]) -> None:
        """Start generating each request's group; return at once."""
        ...

    def collect(self) -> Sequence[Completion]:
        """Block until at least one submitted group finished; return every group finished since the last call."""
        ...

    def abort(self) -> Aborted:
        """Stop every group still generating; return them (and any finished group not collected yet)."""
        ...


class RoundEngine:
    """A round-based ``generate(prompt_ids) -> groups`` callback as an engine (module docstring).

    ``collect`` generates every request submitted since the last call in one call of ``generate`` and returns all
    its groups, in order; ``abort`` has nothing left to stop. It cannot continue aborted groups (it never makes any).

    Args:
        generate: The round-based callback; it is looked up on every round, so a caller may replace it.
    """

    streaming = False
    """Its groups finish whole rounds at a time (the replenisher sizes rounds, not what is in flight)."""

    resumes_partials = False
    """It never aborts a group, so there is none to continue."""

    checks_groups = True
    """``collect`` checks the callback's groups against the contract (:func:`~dapo_verl.sampler.contracts.
    checked_groups`), in the order of the round's prompts."""

    def __init__(self, generate: Callable[[Sequence[int]], Sequence[GroupResult]]) -> None:
        self._generate = generate
        self._pending: list[Request] = []

    def submit(self, requests: Sequence[Request]) -> None:
        for request in requests:
            if request.resume is not None:
                raise ValueError(
                    f"request {request.request_id} continues an aborted group of prompt "
                    f"{request.prompt_id}, but a round-based generate callback cannot continue one; "
                    f"only a streaming engine makes and resumes aborted groups."
                )
        self._pending.extend(requests)

    def collect(self) -> list[Completion]:
        requests, self._pending = self._pending, []
        prompt_ids = [r.prompt_id for r in requests]
        return list(zip(requests, checked_groups(prompt_ids, self._generate(prompt_ids))))

    def abort(self) -> Aborted:
        """Nothing is ever left generating between rounds; requests submitted but not collected are a caller's bug."""
        if self._pending:
            raise RuntimeError(
                f"abort() with {len(self._pending)} requests submitted but not collected; a round "
                f"engine generates them in collect(). This is a dapo_verl bug."
            )
        return Aborted()


ENGINE_TRAITS = ("streaming", "resumes_partials", "checks_groups")


def as_engine(generate: object) -> GenerationEngine | None:
    """``generate`` if it is a :class:`GenerationEngine`, None if it is a plain callback (a round-based ``generate``).

    Raises:
        TypeError: for an object with the engine's methods that lacks one of its declared attributes.
    """
    if isinstance(generate, GenerationEngine):
        return generate
    if all(callable(getattr(generate, name, None)) for name in ("submit", "collect", "abort")):
        missing = [name for name in ENGINE_TRAITS if not hasattr(generate, name)]
        raise TypeError(
            f"{type(generate).__name__} has submit/collect/abort but not {', '.join(missing)}: a GenerationEngine "
            f"declares streaming, resumes_partials and checks_groups (dapo_verl.sampler.engine), e.g. streaming = "
            f"True, resumes_partials = False, checks_groups = False as class attributes."
        )
    return None
