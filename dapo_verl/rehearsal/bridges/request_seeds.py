"""Per-request sampling seeds from a request's content: a rehearsal's rollouts regenerate the same groups.

A rehearsal compares the step trained again after a resume with the same step of the uninterrupted run. An
engine seeded once (vLLM seeds its engine with ``replica_rank + rollout.seed``) spends its random draws in
the order requests arrive -- validation and earlier steps included -- so a resumed run, whose fresh engine
starts from the same seed at a later point, samples other responses. Seeding each request from what it asks
for instead makes the *set* of responses to a prompt independent of arrival order and of the engine's
history: the same weights and the same prompt give the same group.

The n requests of one prompt are identical, so a request also counts how often the same request was seen under
the current weights (the occurrence): the k-th copy gets the k-th seed of that prompt. A new weight version
starts a new stream.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["RequestSeeds"]


class RequestSeeds:
    """Seeds for sampling requests, derived from their content (see the module docstring).

    Args:
        seed: The rollout's seed (``actor_rollout_ref.rollout.seed``); runs with another seed sample otherwise.

    Example:
        >>> seeds = RequestSeeds(seed=7)
        >>> first, second = (seeds.next([1, 2, 3], {"temperature": 1.0}, weights_version=2) for _ in range(2))
        >>> first != second
        True
        >>> again = RequestSeeds(seed=7)
        >>> [again.next([1, 2, 3], {"temperature": 1.0}, weights_version=2) for _ in range(2)] == [first, second]
        True
    """

    def __init__(self, seed: int) -> None:
        self._seed = int(seed)
        self._occurrences: dict[bytes, int] = {}

    def restart(self) -> None:
        """New weights reached the engine: every request starts counting its occurrences again."""
        self._occurrences.clear()

    def next(self, prompt_ids: list[int], sampling_params: dict[str, Any], weights_version: Any) -> int:
        """The seed of this request, an unsigned 64-bit integer: its content, the weights' version (verl's global
        step) and its occurrence since :meth:`restart`, hashed."""
        params = sorted((k, v) for k, v in sampling_params.items() if k != "seed")
        key = hashlib.blake2b(
            repr((self._seed, weights_version, list(prompt_ids), params)).encode(), digest_size=8
        ).digest()
        occurrence = self._occurrences.get(key, 0)
        self._occurrences[key] = occurrence + 1
        return int.from_bytes(hashlib.blake2b(key + occurrence.to_bytes(8, "little"), digest_size=8).digest(), "little")
