"""The groups in flight on a generation engine, and the engine contract checked on everything it returns.

:class:`Flight` numbers the replenisher's requests, hands them to the engine, and takes back what ``collect`` and
``abort`` return only once it keeps the contract of :mod:`~dapo_verl.sampler.engine`: every reported request is
one in flight, reported once, with its own :class:`~dapo_verl.sampler.engine.Request` object; finished groups are
well-formed (:func:`~dapo_verl.sampler.contracts.checked_groups`); ``collect`` returns at least one group; ``abort``
returns every request still in flight. A broken contract is a ``ValueError`` that says what the engine did and
what it must do instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from dapo_verl.sampler.contracts import checked_groups
from dapo_verl.sampler.engine import Aborted, Completion, GenerationEngine, PartialGroup, Request

__all__ = ["Flight"]


class Flight:
    """Requests submitted to ``engine`` and not yet returned (module docstring)."""

    def __init__(self, engine: GenerationEngine) -> None:
        self.engine = engine
        self._inflight: dict[int, Request] = {}
        self._numbered = 0
        # A round engine runs checked_groups on its callback's round already (it knows the round's prompt order).
        self._check_groups = not engine.checks_groups

    def __len__(self) -> int:
        return len(self._inflight)

    def submit(self, items: Sequence[tuple[int, int, PartialGroup | None]]) -> None:
        """Submit ``(prompt_id, born_step, resume)`` items as numbered requests."""
        requests = []
        for prompt_id, born, resume in items:
            self._numbered += 1
            requests.append(Request(request_id=self._numbered, prompt_id=int(prompt_id), born_step=born, resume=resume))
        if requests:
            self.engine.submit(requests)
            self._inflight.update((r.request_id, r) for r in requests)

    def collect(self) -> list[Completion]:
        """The groups the engine reports finished (at least one)."""
        completions = list(self.engine.collect())
        if not completions:
            raise ValueError(
                f"the engine's collect() returned no group while {len(self)} are in flight; it must "
                f"block until at least one finishes."
            )
        self._land(completions)
        return completions

    def abort(self) -> Aborted:
        """Abort everything in flight; every request comes back, finished or partial."""
        if not self._inflight:
            return Aborted()
        aborted = self.engine.abort()
        self._land(aborted.finished)
        for request, _ in aborted.partial:
            self._take(request, "abort() returned")
        if self._inflight:
            raise ValueError(
                f"the engine's abort() left requests {sorted(self._inflight)[:8]} unaccounted for; return "
                f"every request still in flight, as finished or as partial."
            )
        return aborted

    def _land(self, completions: Sequence[Completion]) -> None:
        for request, _ in completions:
            self._take(request, "reported a group for")
        if self._check_groups:
            checked_groups([r.prompt_id for r, _ in completions], [g for _, g in completions])

    def _take(self, request: Request, what: str) -> None:
        request_id = getattr(request, "request_id", None)
        if not isinstance(request_id, int) or self._inflight.pop(request_id, None) is not request:
            raise ValueError(
                f"the engine {what} {request!r}, which is not in flight (or was returned before); return "
                f"each submitted request once, with its Request object."
            )
