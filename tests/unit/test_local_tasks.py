"""The local backend's synthetic tasks: answers, held-out splits and the rule verifier."""

from __future__ import annotations

import pytest
import torch

from dapo_verl.local.tasks import TASKS, make_task, verify

EOS = 1


def test_summod_answers_are_the_last_digit_of_the_sum():
    task = make_task("summod", heldout_size=0, seed=0)
    pairs = dict(zip(task.train_prompts, task.train_answers))
    assert pairs["7+8="] == "5"
    assert pairs["0+0="] == "0"
    assert len(pairs) == 100


def test_summod2_and_copy3_answers():
    summod2 = dict(
        zip(
            *(lambda t: (t.train_prompts + t.eval_prompts, t.train_answers + t.eval_answers))(
                make_task("summod2", heldout_size=200, seed=0)
            )
        )
    )
    assert summod2["47+38="] == "5"
    copy3 = make_task("copy3", heldout_size=200, seed=0)
    assert all(answer == prompt[2] for prompt, answer in zip(copy3.train_prompts, copy3.train_answers))


def test_heldout_split_is_disjoint_seeded_and_complete():
    a = make_task("summod2", heldout_size=200, seed=3)
    b = make_task("summod2", heldout_size=200, seed=3)
    c = make_task("summod2", heldout_size=200, seed=4)
    assert a.heldout
    assert len(a.eval_prompts) == 200
    assert len(a.train_prompts) == 9_800
    assert not set(a.eval_prompts) & set(a.train_prompts)
    assert a.eval_prompts == b.eval_prompts
    assert a.eval_prompts != c.eval_prompts


def test_heldout_size_larger_than_the_task_is_refused():
    with pytest.raises(ValueError, match=r"local\.task\.heldout_size=20000 .*copy3.*10,000 prompts.*<= 9950"):
        make_task("copy3", heldout_size=20000, seed=0)
    with pytest.raises(ValueError, match=r"local\.task\.heldout_size=200 .*summod.*local\.task\.heldout_size=0"):
        make_task("summod", heldout_size=200, seed=0)


def test_heldout_size_zero_evaluates_on_the_training_prompts_and_says_so():
    task = make_task("summod", heldout_size=0, seed=0)
    assert not task.heldout
    assert task.eval_prompts == task.train_prompts


def test_unknown_task_names_the_known_ones():
    with pytest.raises(ValueError, match=r"Unknown local task 'sum'.*summod"):
        make_task("sum", heldout_size=10, seed=0)


def test_task_with_characters_outside_the_alphabet_is_refused():
    TASKS.register("letters", lambda: [("ab=", "c")] * 100)
    try:
        with pytest.raises(ValueError, match="outside the tokenizer's alphabet"):
            make_task("letters", heldout_size=10, seed=0)
    finally:
        TASKS._entries.pop("letters")


def test_verifier_reads_the_answer_from_the_start_and_checks_eos_for_exact():
    responses = torch.tensor(
        [
            [5, EOS, 0, 0],  # right answer, then EOS: correct and exact
            [5, 7, 7, 7],  # right answer, no EOS: correct, not exact
            [6, EOS, 0, 0],  # wrong answer
            [EOS, 0, 0, 0],  # empty response
        ]
    )
    verdict = verify(responses, torch.tensor([[5], [5], [5], [5]]), EOS)
    assert verdict.acc.tolist() == [True, True, False, False]
    assert verdict.exact.tolist() == [True, False, False, False]


def test_verifier_handles_multi_token_answers_and_short_budgets():
    verdict = verify(torch.tensor([[4, 2, EOS], [4, 3, EOS]]), torch.tensor([[4, 2], [4, 2]]), EOS)
    assert verdict.acc.tolist() == [True, False]
    assert verdict.exact.tolist() == [True, False]
    short = verify(torch.tensor([[4]]), torch.tensor([[4, 2]]), EOS)
    assert short.acc.tolist() == [False]


@pytest.mark.parametrize("name", ["dapo_verl.local.tasks", "dapo_verl.local.model"])
def test_docstring_examples_run(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0
    assert result.failed == 0
