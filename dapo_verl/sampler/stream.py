"""Seeded, resumable prompt order, with optional measured skipping of prompts predicted to be uninformative.

Prompts are visited epoch by epoch in a permutation drawn from ``(seed, epoch)``, so the whole stream is
reproduced from two integers. With skipping on, a visited prompt is generated with the probability its
:class:`~dapo_verl.sampler.history.PromptHistory` gives (1 for prompts without an uninformative streak) and
otherwise passed over until its next visit; the draws come from one seeded generator.

Revisits: with ``revisit_capacity > 0`` every prompt whose group was informative joins a first-in,
first-out queue (at most ``revisit_capacity`` prompts; the oldest leave first). When the caller asks for
revisits (:meth:`take` with ``revisit=True``; the replenisher does so while
:func:`~dapo_verl.sampler.history.revisits_pay`), a round first re-asks queued prompts, oldest first, and
then continues the permutation. A revisit leaves the queue when it is handed out and rejoins it only if
it is informative again. A prompt found informative in one round of a step can be re-asked in the next
round of the same step: the batch then holds two independent groups of it (each normalised on its own),
which is where the measured gain is largest -- the policy has not moved, so the prompt is still uncertain.

Ranked selection (with a ``scorer``, e.g. the :class:`~dapo_verl.sampler.prediction.SuccessPredictor`): a
round that wants n prompts draws ``ceil(selection_window * n)`` candidates from the permutation, orders them by
their score (the predicted chance of an informative group), highest first, and takes a prefix; the candidates
it does not take are passed over until their next visit (counted as skipped). Exploration: each place of the
order is, with probability ``explore_fraction``, given to the candidate left that the scorer knows least about
(a prompt never generated, or one whose groups are long forgotten) instead of the best one. Knowledge fades
with the scorer's forgetting, so every prompt comes back to the front of the exploration queue in time, whatever
its prediction, and none is starved for ever; and exploring the unknown first finds the informative prompts the
predictions cannot yet see, where exploring at random would spend those places on prompts known to be useless.
The caller may size the prefix from the ordered scores (``size``: the replenisher sizes a round from the predicted
yield of the prompts it would take); when even the first window's best are not expected to fill the round, the
window doubles, up to ``WINDOW_GROWTH`` windows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from dapo_verl.config import MAX_SEED
from dapo_verl.core import DropReason
from dapo_verl.sampler.arguments import require_flag, require_int, require_real
from dapo_verl.sampler.history import PromptHistory, check_record
from dapo_verl.sampler.state_parts import read_amount, read_count, read_ids, read_rng_state, read_rows, require_keys

__all__ = ["WINDOW_GROWTH", "PromptScorer", "PromptStream", "RoundSize"]

WINDOW_GROWTH = 4
"""Ranked selection: a round whose first window's predicted yield falls short draws more candidates, doubling, up to
this many windows."""

RoundSize = Callable[[list[float], bool], "int | None"]
"""Sizes a ranked round: ``size(predictions, final)`` -> prompts to take, or None (only when not ``final``) to draw
more candidates first."""


class PromptScorer(Protocol):
    """Orders candidate prompts for ranked selection and learns from their groups (module docstring)."""

    step: int
    """The training step, set by the sampler before each round."""

    @property
    def ready(self) -> bool:
        """Whether scores are predictions yet (before, candidates are still ranked, but no score is kept)."""
        ...

    def scores(self, prompt_ids: Sequence[int]) -> list[float]:
        """One prediction per prompt (for the sampler's round sizing and calibration)."""
        ...

    def rank_keys(self, prompt_ids: Sequence[int], generator: torch.Generator) -> list[float]:
        """One ranking key per prompt, higher chosen first; may draw from ``generator`` (the stream's seeded one)."""
        ...

    def evidence(self, prompt_ids: Sequence[int]) -> list[float]:
        """How much is known about each prompt (0: nothing); exploration looks at the least known first."""
        ...

    def taken(self, prompt_ids: Sequence[int]) -> None:
        """The prompts a round takes, before generation (a scorer may note what it predicted for them)."""
        ...

    def record(self, prompt_id: int, correct: int, group_size: int) -> None:
        """Account one generated group of ``prompt_id``: ``correct`` of ``group_size`` responses were right."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


_EPOCH_SEED_STRIDE = 1_000_003


class PromptStream:
    """Hands out prompt ids from ``range(num_prompts)``, epoch after epoch.

    Args:
        num_prompts: Size of the prompt source.
        seed: Seed of the per-epoch permutations and the skip draws.
        shuffle: Visit prompts in a seeded random order (True) or in index order.
        skip_uninformative: Pass over prompts the history predicts to be uninformative (module docstring).
        max_skip_probability: Cap on any prompt's skip probability; must be < 1.
        smoothing_groups: Groups each streak bucket's measured rate averages over.
        exhausted_streak: Streak length from which a prompt counts as exhausted.
        revisit_capacity: Most prompts waiting to be revisited; 0 never revisits.
        scorer: Ranks candidates (module docstring: ranked selection); with ``skip_uninformative`` it replaces the
            per-visit skipping by streak. None: per-visit skipping (or none).
        selection_window: Ranked selection: candidates drawn per prompt taken (>= 1).
        explore_fraction: Ranked selection: share of places given to the least known candidate, in [0, 1].

    Raises:
        TypeError, ValueError: naming an argument that is not of its type or out of its range.
    """

    def __init__(
        self,
        num_prompts: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        skip_uninformative: bool = False,
        max_skip_probability: float = 0.9,
        smoothing_groups: float = 512.0,
        exhausted_streak: int = 3,
        revisit_capacity: int = 0,
        scorer: PromptScorer | None = None,
        selection_window: float = 8.0,
        explore_fraction: float = 0.05,
    ) -> None:
        self.num_prompts = require_int(
            "num_prompts",
            num_prompts,
            low=1,
            fix=(
                "It is the number of prompts in the training data: a positive integer (0 means the prompt source is "
                "empty; check the training data path)."
            ),
        )
        self.seed = require_int("seed", seed, low=0, high=MAX_SEED, fix="Use the run's data.seed.")
        self.shuffle = require_flag("shuffle", shuffle, fix="True visits prompts in a seeded random order.")
        self.skip_uninformative = require_flag(
            "skip_uninformative", skip_uninformative, fix="Use True to pass over prompts predicted to be uninformative."
        )
        self.history = PromptHistory(
            num_prompts,
            smoothing_groups=smoothing_groups,
            max_skip_probability=max_skip_probability,
            exhausted_streak=exhausted_streak,
        )
        self.epoch = 0
        self.position = 0
        self.prompts_consumed = 0
        self.prompts_skipped = 0
        self.revisit_capacity = require_int("revisit_capacity", revisit_capacity, low=0, fix="0 never revisits.")
        self.prompts_revisited = 0
        self._revisit: dict[int, None] = {}  # prompt ids waiting for a revisit, oldest first (an ordered set)
        self._handed_out: set[int] = set()  # revisits handed out whose group has not been recorded yet
        self.scorer = scorer
        self.selection_window = require_real(
            "selection_window", selection_window, low=1.0, fix="Use e.g. 8.0 candidates per prompt taken."
        )
        self.explore_fraction = require_real(
            "explore_fraction", explore_fraction, low=0.0, high=1.0, fix="Use e.g. 0.05 (one place in 20 explores)."
        )
        self._scored: dict[int, float] = {}  # prompts handed out by ranked selection -> their score, until recorded
        self._rng = torch.Generator().manual_seed(seed)
        self._order = self._permutation(0)

    @property
    def ranks(self) -> bool:
        """Whether rounds are chosen by ranked selection (a scorer, with skipping on)."""
        return self.scorer is not None and self.skip_uninformative

    def _permutation(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_prompts))
        gen = torch.Generator().manual_seed(self.seed * _EPOCH_SEED_STRIDE + epoch)
        return torch.randperm(self.num_prompts, generator=gen).tolist()

    def _next_id(self) -> int:
        if self.position == self.num_prompts:
            self.epoch += 1
            self.position = 0
            self._order = self._permutation(self.epoch)
        prompt_id = self._order[self.position]
        self.position += 1
        return prompt_id

    def skip_probability(self, prompt_id: int) -> float:
        """Current probability that a visit to ``prompt_id`` passes it over."""
        if not self.skip_uninformative:
            return 0.0
        return 1.0 - self.history.generate_probability(prompt_id)

    def take(self, count: int, *, revisit: bool = False, size: RoundSize | None = None) -> tuple[list[int], int]:
        """The next ``count`` prompt ids, and how many prompts were skipped to find them.

        Args:
            count: Prompts wanted.
            revisit: Re-ask queued prompts first (module docstring).
            size: Ranked selection only: given the scores of the whole order (revisits first) and whether the
                candidates may still grow, the number of prompts to take instead of ``count`` (clamped to [1, the
                order's length]), or None to draw twice as many candidates, up to ``WINDOW_GROWTH`` windows.

        After ``num_prompts`` skips in a row the next prompt is taken regardless, so the call always ends.

        Raises:
            TypeError, ValueError: for a count that is not an integer >= 0.
        """
        count = require_int("count", count, low=0, fix="Pass how many prompts the round wants.")
        if self.ranks:
            return self._take_ranked(count, revisit=revisit, size=size)
        ids = self._take_revisits(count) if revisit else []
        skipped = 0
        run = 0
        while len(ids) < count:
            prompt_id = self._next_id()
            probability = self.skip_probability(prompt_id)
            if probability > 0 and run < self.num_prompts and float(torch.rand((), generator=self._rng)) < probability:
                skipped += 1
                run += 1
                continue
            run = 0
            ids.append(prompt_id)
        self.prompts_consumed += len(ids)
        self.prompts_skipped += skipped
        return ids, skipped

    def _take_ranked(self, count: int, *, revisit: bool, size: RoundSize | None) -> tuple[list[int], int]:
        """Ranked selection (module docstring): revisits first, then the best of the drawn candidates."""
        assert self.scorer is not None
        revisits = self._take_revisits(count) if revisit else []
        wanted = max(count - len(revisits), 0)
        available = self.num_prompts - len(revisits)
        drawn = min(available, math.ceil(self.selection_window * wanted))
        limit = min(available, math.ceil(self.selection_window * wanted * WINDOW_GROWTH))
        candidates: list[int] = []
        taken = set(revisits)
        while True:
            self._draw(candidates, taken, drawn)
            order = revisits + self._ranked(candidates)
            scores = self.scorer.scores(order)
            if size is None:
                chosen = len(revisits) + min(wanted, len(candidates))
                break
            sized = size(scores, drawn >= limit)
            if sized is not None:
                chosen = max(1, min(int(sized), len(order)))
                break
            drawn = min(limit, 2 * drawn)  # the predicted yield fell short: look at more candidates
        ids = order[:chosen]
        self.scorer.taken(ids)
        if self.scorer.ready:
            self._scored.update(zip(ids, scores[:chosen]))
        skipped = len(order) - chosen
        if size is None and len(ids) < count:  # a pool smaller than the round: some prompts twice, as unranked
            ids += [self._next_id() for _ in range(count - len(ids))]
        self.prompts_consumed += len(ids)
        self.prompts_skipped += skipped
        return ids, skipped

    def _draw(self, candidates: list[int], taken: set[int], drawn: int) -> None:
        """Extend ``candidates`` to ``drawn`` prompts of the data order (an epoch boundary can repeat a prompt;
        the repeat is skipped)."""
        while len(candidates) < drawn:
            prompt_id = self._next_id()
            if prompt_id not in taken:
                taken.add(prompt_id)
                candidates.append(prompt_id)

    def _ranked(self, candidates: list[int]) -> list[int]:
        """Candidates by ranking key, highest first, each place given with probability ``explore_fraction`` to the
        least known candidate left instead (module docstring)."""
        if not candidates:
            return []
        assert self.scorer is not None
        keys = self.scorer.rank_keys(candidates, self._rng)
        best = sorted(range(len(candidates)), key=lambda i: (-keys[i], i))  # ties keep the permutation's order
        left = dict.fromkeys(best)  # indices not placed yet, best first (an ordered set)
        draws = torch.rand(len(candidates), generator=self._rng).tolist()
        unknown: list[int] = []  # indices by evidence, least known first; computed at the first exploring place
        order = []
        for draw in draws:
            if draw < self.explore_fraction:
                if not unknown:
                    evidence = self.scorer.evidence(candidates)
                    unknown = sorted(range(len(candidates)), key=lambda i: (evidence[i], i), reverse=True)
                while unknown[-1] not in left:
                    unknown.pop()
                index = unknown.pop()
            else:
                index = next(iter(left))
            del left[index]
            order.append(index)
        return [candidates[i] for i in order]

    def _take_revisits(self, count: int) -> list[int]:
        due = list(self._revisit)[:count]
        for pid in due:
            del self._revisit[pid]
        self._handed_out.update(due)
        self.prompts_revisited += len(due)
        return due

    def record(
        self, prompt_id: int, reason: DropReason, *, correct: int | None = None, group_size: int | None = None
    ) -> float | None:
        """Update a prompt's history after its group was scored.

        Args:
            prompt_id: The prompt.
            reason: The group filter's verdict.
            correct: Correct responses in the group, for the scorer (None: the scorer is not told).
            group_size: G of the group (with ``correct``).

        Returns:
            The prompt's score when ranked selection took it (its predicted chance of an informative group), else
            None.

        Raises:
            TypeError, ValueError: for a prompt id outside ``range(num_prompts)``, a reason that is not a DropReason,
                or (from the scorer) counts that do not fit; nothing is recorded then.
        """
        check_record(prompt_id, reason, self.num_prompts, correct, group_size)
        revisit = prompt_id in self._handed_out
        self._handed_out.discard(prompt_id)
        self.history.record(prompt_id, reason, revisit=revisit)
        predicted = self._scored.pop(prompt_id, None)
        if self.scorer is not None and correct is not None and group_size is not None:
            self.scorer.record(prompt_id, correct, group_size)
        self._queue_revisit(prompt_id, reason)
        return predicted

    def _queue_revisit(self, prompt_id: int, reason: DropReason) -> None:
        if reason != DropReason.KEEP or not self.revisit_capacity:
            return
        self._revisit.pop(prompt_id, None)
        self._revisit[prompt_id] = None
        if len(self._revisit) > self.revisit_capacity:
            del self._revisit[next(iter(self._revisit))]

    @property
    def revisits_waiting(self) -> int:
        """Prompts queued for a revisit."""
        return len(self._revisit)

    @property
    def history_size(self) -> int:
        """Prompts currently holding an uninformative streak (at most ``num_prompts``)."""
        return self.history.size

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state: position, counters, the prompt history and the skip RNG."""
        return {
            "num_prompts": self.num_prompts,
            "epoch": self.epoch,
            "position": self.position,
            "prompts_consumed": self.prompts_consumed,
            "prompts_skipped": self.prompts_skipped,
            "prompts_revisited": self.prompts_revisited,
            "revisit": list(self._revisit),
            "handed_out": sorted(self._handed_out),
            "history": self.history.state_dict(),
            "rng": self._rng.get_state(),
            "scored": sorted([pid, score] for pid, score in self._scored.items()),
            **({"scorer": self.scorer.state_dict()} if self.scorer is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the prompt source must have the same size.

        A state without ``history`` (sampler state version 1, whose streaks did not record whether they
        were all-correct or all-wrong) restores everything else; prompt histories then start afresh.

        Raises:
            TypeError, ValueError: naming a part that is missing, of the wrong type or out of range (a negative count,
                a prompt outside the pool); the stream, its history and its scorer are then unchanged.
        """
        owner, last = "PromptStream", self.num_prompts - 1
        parts = require_keys(
            owner, state, ("num_prompts", "epoch", "position", "prompts_consumed", "prompts_skipped", "rng")
        )
        if read_count(owner, "num_prompts", parts["num_prompts"]) != self.num_prompts:
            raise ValueError(
                f"The saved sampler state covers {parts['num_prompts']} prompts but the prompt source has "
                f"{self.num_prompts}; resume with the same training data, or start a fresh run."
            )
        counts = {
            key: read_count(owner, key, parts.get(key, 0))
            for key in ("epoch", "prompts_consumed", "prompts_skipped", "prompts_revisited")
        }
        position = read_count(owner, "position", parts["position"], high=self.num_prompts)
        revisit = read_ids(owner, "revisit", parts.get("revisit", []), self.num_prompts)
        handed_out = read_ids(owner, "handed_out", parts.get("handed_out", []), self.num_prompts)
        scored = {
            read_count(owner, "scored", pid, high=last): read_amount(owner, "scored", score, low=None)
            for pid, score in read_rows(owner, "scored", parts.get("scored", []), 2)
        }
        rng = read_rng_state(owner, "rng", parts["rng"])
        history_before = self.history.state_dict()
        self.history.load_state_dict(parts.get("history", {}))
        try:
            if self.scorer is not None:  # a state without one (written before ranked selection) starts it afresh
                self.scorer.load_state_dict(parts.get("scorer", {}))
        except (TypeError, ValueError):
            self.history.load_state_dict(history_before)
            raise
        self.epoch, self.position, self.prompts_consumed, self.prompts_skipped, self.prompts_revisited = (
            counts["epoch"],
            position,
            counts["prompts_consumed"],
            counts["prompts_skipped"],
            counts["prompts_revisited"],
        )
        self._revisit, self._handed_out, self._scored = dict.fromkeys(revisit), set(handed_out), scored
        self._rng.set_state(rng)
        self._order = self._permutation(self.epoch)
