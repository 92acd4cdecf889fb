"""Synthetic verifiable tasks for the local backend: prompts, rule-checked answers and the verifier.

Every task is a set of fixed-length character prompts with one short answer each, so a tiny model can
learn it by reinforcement learning alone and the reward is checked by a rule, as in the paper's
math setting (arXiv 2503.14476, §2.3, Eq. 1: R = 1 if the answer is correct, else -1).

The verifier reads the answer from the start of the response and ignores what follows, the way a math
grader extracts the final answer: a response is **correct** (``acc``) when its first ``K`` tokens are the
answer's ``K`` characters. It is **exact** when the end-of-sequence token follows immediately. Correctness
is the raw outcome that dynamic sampling filters on; the length and format of the response are left
to the soft overlong punishment (paper §3.4), which is what teaches the model to stop after the answer.

Tasks (``local.task.name``):

* ``copy3`` (default): ``abcd>`` -> ``c``, copy the third of four digits: 10,000 prompts, of which
  ``local.task.heldout_size`` are held out for evaluation and never trained on. One attention pattern to
  find, so a 132k-parameter model learns it by RL alone in about a minute.
* ``summod``: ``a+b=`` -> ``(a + b) % 10`` for digits a, b: a 100-entry table, learned more slowly. Too few
  prompts for the default held-out split: run it with ``local.task.heldout_size=0`` to evaluate on all 100
  (the training prompts), or hold out at most 50.
* ``summod2``: ``ab+cd=`` -> the last digit of the two-digit sum ``ab + cd``: 10,000 prompts with a held-out
  split; the model must also learn to ignore the tens digits (not learned within the default budget).

Decoys (:data:`DECOYS`, used by the warm start of :mod:`.warm_start`): for each prompt, wrong answers a
plausible but wrong rule gives -- the other three digits for ``copy3``, an operand (its last digit for
``summod2``) for the sum tasks. A policy warm-started onto them starts RL confident and mostly wrong, with the
correct answer rare: the situation in which clip-higher is meant to matter (paper §3.1).

Shape legend: N responses, L padded response length, K answer tokens.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from dapo_verl.core import Registry

__all__ = ["ALPHABET", "DECOYS", "TASKS", "TaskData", "Verdict", "decoy_answers", "make_task", "verify"]

ALPHABET = "0123456789+=>,"
"""Every character a task prompt or answer may use; the tokenizer's vocabulary beyond pad and EOS."""

_Builder = Callable[[], list[tuple[str, str]]]
TASKS: Registry[_Builder] = Registry(
    "local task",
    "Register a builder returning [(prompt, answer), ...] with TASKS.register in dapo_verl/local/tasks.py.",
)
"""Task name -> builder of every ``(prompt, answer)`` pair, in a fixed order."""


def _summod() -> list[tuple[str, str]]:
    return [(f"{a}+{b}=", str((a + b) % 10)) for a, b in itertools.product(range(10), repeat=2)]


def _summod2() -> list[tuple[str, str]]:
    return [(f"{a:02d}+{b:02d}=", str((a + b) % 10)) for a, b in itertools.product(range(100), repeat=2)]


def _copy3() -> list[tuple[str, str]]:
    return [(f"{n:04d}>", f"{n:04d}"[2]) for n in range(10_000)]


TASKS.register("summod", _summod)
TASKS.register("summod2", _summod2)
TASKS.register("copy3", _copy3)

DECOYS: Registry[Callable[[str], list[str]]] = Registry(
    "decoy rule",
    "Register a function prompt -> [wrong answer, ...] with DECOYS.register in dapo_verl/local/tasks.py.",
)
"""Task name -> the decoy answers of a prompt (wrong answers of a plausible rule; they may equal the answer)."""

DECOYS.register("copy3", lambda prompt: [prompt[0], prompt[1], prompt[3]])  # "abcd>": the other digits
DECOYS.register("summod", lambda prompt: [prompt[0], prompt[2]])  # "a+b=": copy an operand
DECOYS.register("summod2", lambda prompt: [prompt[1], prompt[4]])  # "ab+cd=": an operand's last digit


def decoy_answers(name: str, prompts: Sequence[str]) -> list[list[str]]:
    """The decoy answers of each prompt of task ``name`` (as many per prompt for every prompt).

    Raises:
        ValueError: if the task has no decoy rule in :data:`DECOYS`.

    Example:
        >>> decoy_answers("copy3", ["1234>"])
        [['1', '2', '4']]
    """
    rule = DECOYS.get(name)
    return [rule(prompt) for prompt in prompts]


_MIN_TRAIN_PROMPTS = 50
"""A held-out split must leave at least this many prompts for training."""


@dataclass(frozen=True)
class TaskData:
    """A task's prompts split into training and evaluation sets.

    Attributes:
        name: The task's registered name.
        train_prompts, train_answers: What the sampler draws from.
        eval_prompts, eval_answers: What greedy evaluation scores.
        heldout: True when the evaluation prompts are disjoint from the training prompts; False when
            ``heldout_size=0`` asked to evaluate on every prompt.
    """

    name: str
    train_prompts: list[str]
    train_answers: list[str]
    eval_prompts: list[str]
    eval_answers: list[str]
    heldout: bool

    @property
    def prompt_length(self) -> int:
        """Characters (= tokens) per prompt; the same for every prompt of a task."""
        return len(self.train_prompts[0])

    @property
    def answer_length(self) -> int:
        """K, characters (= tokens) per answer; the same for every prompt of a task."""
        return len(self.train_answers[0])


def make_task(name: str, *, heldout_size: int, seed: int) -> TaskData:
    """Build a task and split off ``heldout_size`` evaluation prompts by a seeded permutation.

    Args:
        name: A name in :data:`TASKS` (``local.task.name``).
        heldout_size: Prompts held out for evaluation (``local.task.heldout_size``); 0 evaluates on every
            prompt, the training prompts included (``TaskData.heldout`` is then False).
        seed: Seed of the split (``data.seed``).

    Raises:
        ValueError: for an unknown task, a negative ``heldout_size`` or one that leaves fewer than 50
            training prompts, or prompts or answers of unequal length or outside :data:`ALPHABET`.
    """
    pairs = TASKS.get(name)()
    _check_pairs(name, pairs)
    prompts, answers = [p for p, _ in pairs], [a for _, a in pairs]
    largest = len(pairs) - _MIN_TRAIN_PROMPTS
    if heldout_size < 0 or heldout_size > largest:
        raise ValueError(
            f"local.task.heldout_size={heldout_size} does not fit task {name} ({len(pairs):,} prompts): a held-out "
            f"split must leave at least {_MIN_TRAIN_PROMPTS} prompts to train on, and a larger one would evaluate "
            f"on training prompts under val-core/. Set local.task.heldout_size <= {largest}, or "
            f"local.task.heldout_size=0 to evaluate on every prompt (the training prompts included)."
        )
    if heldout_size == 0:
        return TaskData(name, prompts, answers, prompts, answers, heldout=False)
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(seed)).tolist()
    held, train = sorted(order[:heldout_size]), sorted(order[heldout_size:])
    return TaskData(
        name,
        [prompts[i] for i in train],
        [answers[i] for i in train],
        [prompts[i] for i in held],
        [answers[i] for i in held],
        heldout=True,
    )


def _check_pairs(name: str, pairs: Sequence[tuple[str, str]]) -> None:
    if not pairs:
        raise ValueError(f"Task {name!r} has no prompts; its builder must return (prompt, answer) pairs.")
    lengths = {(len(p), len(a)) for p, a in pairs}
    if len(lengths) != 1:
        raise ValueError(
            f"Task {name!r} mixes prompt/answer lengths {sorted(lengths)}; the local backend needs "
            f"fixed-length prompts and answers (no padding). Pad them with a fixed format."
        )
    bad = {c for p, a in pairs for c in p + a if c not in ALPHABET}
    if bad:
        raise ValueError(
            f"Task {name!r} uses characters {sorted(bad)} outside the tokenizer's alphabet "
            f"{ALPHABET!r}; extend ALPHABET in dapo_verl/local/tasks.py."
        )


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of N responses.

    Attributes:
        acc: (N,) bool. The answer is correct: the response starts with the answer's tokens.
        exact: (N,) bool. Correct and immediately followed by the end-of-sequence token.
    """

    acc: Tensor
    exact: Tensor


def verify(responses: Tensor, answers: Tensor, eos_token_id: int) -> Verdict:
    """Check responses against the answers by rule.

    Args:
        responses: (N, L) int64. Generated token ids, padded after the end of each response.
        answers: (N, K) int64. The answer's token ids for each response's prompt.
        eos_token_id: The end-of-sequence token id.

    Returns:
        The :class:`Verdict`; a response shorter than the answer is never correct.

    Example:
        >>> v = verify(torch.tensor([[5, 1, 0], [5, 7, 1], [6, 1, 0]]), torch.tensor([[5], [5], [5]]), 1)
        >>> v.acc.tolist(), v.exact.tolist()
        ([True, True, False], [True, False, False])
    """
    k = answers.shape[1]
    if responses.shape[1] < k:
        false = torch.zeros(responses.shape[0], dtype=torch.bool, device=responses.device)
        return Verdict(acc=false, exact=false)
    acc = (responses[:, :k] == answers).all(dim=1)  # (N,)
    if responses.shape[1] == k:
        return Verdict(acc=acc, exact=torch.zeros_like(acc))
    return Verdict(acc=acc, exact=acc & (responses[:, k] == eos_token_id))
