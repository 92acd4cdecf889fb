"""Deduplicate DAPO-style problems, count duplicates under every key, and handle conflicting answers.

BytedTsinghua-SIA/DAPO-Math-17k stores each of its ~17.9k prompts about 100 times (DAPO#15, verl#3065), and
about 519 of its UUIDs repeat a problem text that another UUID already has. How many rows survive depends on
the key (``DedupKey``):

* ``prompt``: the problem text with the DAPO template removed and whitespace runs collapsed (default; the
  paper's "17K prompts" are problems, and a repeated problem is the same training signal);
* ``uuid``: the source's ``extra_info.index``, exactly as stored; rows sharing an identifier must hold the same
  problem and answer (whitespace aside), else they are different problems under one identifier, an error;
* ``prompt_answer``: the normalised problem text together with the stripped ground truth.

The first occurrence in file order is kept, so results are deterministic. Whatever the key, the counts under
all three keys are reported, as is the number of problem texts that carry more than one distinct ground truth
("conflicting"); ``ConflictPolicy`` keeps those rows (first occurrence wins under ``prompt``) or drops every
row of such a problem.

Every ground truth must be one that verl's ``math_dapo`` scorer can match (it compares the normalised text after
the last ``Answer:`` of a response, read up to the line's end, with the normalised ground truth): a blank one
normalises to ``''``, which only an empty answer matches; one with a line break can never match, because the
answer is read from one line; other control characters (a NUL byte) are not text a model writes. Such a row is an
error naming the file, row and value (:func:`unscorable_reason`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from dapo_verl.data.schema import DAPO_PROMPT_PREFIX, DAPO_PROMPT_SUFFIX, dapo_prompt, normalize_text, split_dapo_prompt
from dapo_verl.data.sources import SourceRow

__all__ = ["ConflictPolicy", "DedupKey", "DedupStats", "Problem", "deduplicate", "unscorable_reason"]

logger = logging.getLogger(__name__)

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters other than tab and line feed (a line feed inside an answer has its own reason)."""


class DedupKey(StrEnum):
    """What makes two rows the same problem (see the module docstring)."""

    PROMPT = "prompt"
    UUID = "uuid"
    PROMPT_ANSWER = "prompt_answer"


class ConflictPolicy(StrEnum):
    """What to do with a problem text that appears with different ground truths: ``keep`` or ``drop`` its rows."""

    KEEP = "keep"
    DROP = "drop"


class Problem(NamedTuple):
    """One kept row, ready to become a verl row."""

    prompt: str
    """The user message in the DAPO template (the source's text when it already was in the template)."""
    raw_problem: str
    ground_truth: str
    source_id: str | None
    ability: str | None
    style: str | None
    built: bool
    """True when the prompt was built from a raw problem, False when kept as the source had it."""
    problem_key: str
    """The normalised problem text (``DedupKey.PROMPT``)."""


@dataclass(frozen=True, kw_only=True)
class DedupStats:
    """Counts from one deduplication pass."""

    rows_in: int
    unique_prompts: int
    unique_prompt_answers: int
    unique_source_ids: int | None
    """Distinct ``extra_info.index`` values; None when the source has no identifier column."""
    conflicting_prompts: int
    """Problem texts that carry more than one distinct ground truth."""
    conflict_rows_dropped: int
    """Rows removed because of conflicting answers (0 under ``ConflictPolicy.KEEP``)."""
    rows_out: int
    prompts_built: int
    """Output rows whose prompt was built from a raw problem (the rest kept the source's text)."""
    copies_min: int
    copies_max: int
    """Fewest and most source rows behind one output row, under the chosen key."""
    dedup_key: str
    conflicts: str

    def as_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict."""
        return asdict(self)


def _parse_text(text: str, where: str) -> tuple[str, str, bool]:
    """(prompt, raw problem, built) for a stored text: keep a DAPO-template message, wrap a raw problem."""
    raw = split_dapo_prompt(text)
    if raw is None and (text.startswith(DAPO_PROMPT_PREFIX) or text.endswith(DAPO_PROMPT_SUFFIX)):
        raise ValueError(
            f"{where}: the text has only part of the DAPO prompt template (the instruction or the "
            "reminder, not both), so it is neither a DAPO prompt nor a raw problem. Store either the "
            "exact template or the bare problem."
        )
    if not (text if raw is None else raw).strip():
        raise ValueError(f"{where}: the problem text is empty. Drop that row from the input file.")
    return (text, raw, False) if raw is not None else (dapo_prompt(text), text, True)


def unscorable_reason(ground_truth: str) -> str | None:
    """Why verl's ``math_dapo`` can never score a response right against ``ground_truth``; None when it can.

    Example:
        >>> unscorable_reason("12") is None
        True
        >>> unscorable_reason("1\\n2")
        'spans two lines: math_dapo reads the answer from one line'
    """
    text = ground_truth.strip()  # math_dapo strips the normalised answer
    if not text:
        return (
            f"is blank ({len(ground_truth)} whitespace character(s)): math_dapo normalises it to '', which only "
            "an empty answer matches"
        )
    if "\n" in text:
        return "spans two lines: math_dapo reads the answer from one line"
    control = _CONTROL.search(text)
    if control:
        return f"holds the control character {control.group()!r}, which no written answer contains (a damaged file?)"
    return None


def _check_ground_truth(ground_truth: str, where: str) -> None:
    reason = unscorable_reason(ground_truth)
    if reason is not None:
        shown = repr(ground_truth) if len(ground_truth) <= 60 else repr(ground_truth[:60]) + "..."
        raise ValueError(
            f"{where}: reward_model.ground_truth {shown} {reason}, so no response can be scored right "
            "against it. Fix or drop that row in the input file."
        )


class _Counts:
    """Running counts under every key; answers per problem text give the prompt, prompt+answer and conflict counts."""

    def __init__(self) -> None:
        self.rows = 0
        self.answers: dict[str, set[str]] = {}
        self.source_ids: set[str] | None = set()

    def add(self, problem_key: str, answer_key: str, source_id: str | None) -> None:
        self.rows += 1
        self.answers.setdefault(problem_key, set()).add(answer_key)
        if source_id is None:
            self.source_ids = None
        elif self.source_ids is not None:
            self.source_ids.add(source_id)

    def is_conflicting(self, problem_key: str) -> bool:
        return len(self.answers[problem_key]) > 1


def _check_same_problem(
    first: tuple[int, str, str], row: SourceRow, problem_key: str, answer_key: str, dataset: str
) -> None:
    """Rows sharing an ``extra_info.index`` must be one problem (``--dedup-key uuid``); else raise naming both."""
    first_row, first_problem, first_answer = first
    if (first_problem, first_answer) == (problem_key, answer_key):
        return
    what, a, b = (
        ("problem text", first_problem, problem_key)
        if first_problem != problem_key
        else ("answer", first_answer, answer_key)
    )
    raise ValueError(
        f"{dataset}: rows {first_row} and {row.row} share extra_info.index {row.source_id!r} but differ "
        f"in their {what} ({a[:60]!r} vs {b[:60]!r}); --dedup-key uuid would keep one and drop the other "
        "problem. Give each problem its own identifier, or use --dedup-key prompt (the default) or "
        "prompt_answer."
    )


def _row_key(key: DedupKey, problem_key: str, answer_key: str, row: SourceRow, where: str) -> str | tuple[str, str]:
    if key is DedupKey.PROMPT:
        return problem_key
    if key is DedupKey.PROMPT_ANSWER:
        return problem_key, answer_key
    if row.source_id is None:
        raise ValueError(
            f"{where}: dedup key 'uuid' needs extra_info.index, which this row lacks. "
            "Use --dedup-key prompt (or prompt_answer) for files without identifiers."
        )
    return row.source_id


def deduplicate(
    rows: Iterable[SourceRow], *, key: DedupKey, conflicts: ConflictPolicy, dataset: str = "input"
) -> tuple[list[Problem], DedupStats]:
    """Keep the first row of every distinct ``key``, in file order, and count duplicates under every key.

    Args:
        rows: Source rows in file order (from :meth:`SourceTable.rows`).
        key: Which rows count as the same problem.
        conflicts: Keep or drop problem texts that appear with different ground truths.
        dataset: Name used in error messages.

    Returns:
        The kept problems (file order) and the counts.

    Raises:
        ValueError: for a row with a partial template, an empty problem or a ground truth ``math_dapo`` can never
            match, ``key=uuid`` without identifiers or with one identifier on two different problems, or when no
            row is left.
    """
    key, conflicts = DedupKey(key), ConflictPolicy(conflicts)
    counts = _Counts()
    first: dict[str | tuple[str, str], int] = {}  # row key -> position in kept
    first_rows: dict[str | tuple[str, str], tuple[int, str, str]] = {}  # under uuid: row, problem, answer
    kept: list[Problem] = []
    copies: list[int] = []
    parsed: dict[str, tuple[str, str, bool, str]] = {}  # each text repeats ~100 times: parse it once
    scorable: set[str] = set()  # ground truths already checked
    for row in rows:
        where = f"{dataset}, row {row.row}"
        if row.text not in parsed:
            prompt, raw, built = _parse_text(row.text, where)
            parsed[row.text] = (prompt, raw, built, normalize_text(raw))
        prompt, raw, built, problem_key = parsed[row.text]
        if row.ground_truth not in scorable:
            _check_ground_truth(row.ground_truth, where)
            scorable.add(row.ground_truth)
        answer_key = normalize_text(row.ground_truth)
        counts.add(problem_key, answer_key, row.source_id)
        row_key = _row_key(key, problem_key, answer_key, row, where)
        if row_key in first:
            if key is DedupKey.UUID:
                _check_same_problem(first_rows[row_key], row, problem_key, answer_key, dataset)
            copies[first[row_key]] += 1
            continue
        first[row_key] = len(kept)
        if key is DedupKey.UUID:
            first_rows[row_key] = (row.row, problem_key, answer_key)
        copies.append(1)
        kept.append(Problem(prompt, raw, row.ground_truth, row.source_id, row.ability, row.style, built, problem_key))
    return _finish(kept, copies, counts, key=key, conflicts=conflicts, dataset=dataset)


def _finish(
    kept: list[Problem], copies: list[int], counts: _Counts, *, key: DedupKey, conflicts: ConflictPolicy, dataset: str
) -> tuple[list[Problem], DedupStats]:
    conflicting = [k for k in counts.answers if counts.is_conflicting(k)]
    for problem_key in conflicting[:3]:
        logger.warning(
            "%s: problem %r has %d different ground truths %s",
            dataset,
            problem_key[:80],
            len(counts.answers[problem_key]),
            sorted(counts.answers[problem_key]),
        )
    keep = [conflicts is ConflictPolicy.KEEP or not counts.is_conflicting(p.problem_key) for p in kept]
    out = [p for p, k in zip(kept, keep) if k]
    out_copies = [c for c, k in zip(copies, keep) if k]
    if not out:
        raise ValueError(
            f"{dataset}: no rows left after deduplication (key={key.value}, conflicts={conflicts.value}); "
            f"{counts.rows} rows were read. Check the input file, or use --conflicts keep."
        )
    stats = DedupStats(
        rows_in=counts.rows,
        unique_prompts=len(counts.answers),
        unique_prompt_answers=sum(len(a) for a in counts.answers.values()),
        unique_source_ids=None if counts.source_ids is None else len(counts.source_ids),
        conflicting_prompts=len(conflicting),
        conflict_rows_dropped=len(kept) - len(out),
        rows_out=len(out),
        prompts_built=sum(p.built for p in out),
        copies_min=min(out_copies),
        copies_max=max(out_copies),
        dedup_key=key.value,
        conflicts=conflicts.value,
    )
    return out, stats
