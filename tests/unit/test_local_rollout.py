"""Scoring of generated responses: masks, lengths, truncation, correctness and the overlong-shaped score."""

from __future__ import annotations

import torch

from dapo_verl.config import OverlongConfig
from dapo_verl.local.rollout import Responses

EOS, PAD, BUDGET = 1, 0, 6


def _responses(rows, *, penalty=True):
    overlong = OverlongConfig(overlong_reward_penalty=penalty, overlong_tokens=4, overlong_penalty_factor=1.0)
    tokens = torch.tensor(rows)
    answers = torch.full((len(rows), 1), 5)
    return Responses(tokens, answers, eos_id=EOS, pad_id=PAD, budget=BUDGET, overlong=overlong)


def test_response_ends_at_its_first_eos_inclusive():
    out = _responses([[5, EOS, 7, EOS, 7, 7], [9, 9, 9, 9, 9, 9]])
    assert out.mask.tolist() == [[True, True, False, False, False, False], [True] * 6]
    assert out.lengths.tolist() == [2, 6]
    assert out.tokens[0].tolist() == [5, EOS, PAD, PAD, PAD, PAD]
    assert out.truncated.tolist() == [False, True]


def test_score_is_plus_minus_one_plus_the_soft_overlong_punishment():
    # budget 6, ramp of 4 tokens: no penalty up to 2 tokens, -0.25 per token after, -1 at 6.
    out = _responses(
        [
            [5, EOS, PAD, PAD, PAD, PAD],  # correct, 2 tokens
            [5, 7, EOS, PAD, PAD, PAD],  # correct, 3 tokens
            [5, 7, 7, 7, 7, 7],  # correct, truncated
            [6, EOS, PAD, PAD, PAD, PAD],  # wrong, 2 tokens
            [EOS, PAD, PAD, PAD, PAD, PAD],  # empty
            [6, 7, 7, 7, 7, 7],  # wrong, truncated
        ]
    )
    assert out.acc.tolist() == [True, True, True, False, False, False]
    assert out.exact.tolist() == [True, False, False, False, False, False]
    assert torch.allclose(out.scores, torch.tensor([1.0, 0.75, 0.0, -1.0, -1.0, -2.0]))


def test_without_the_penalty_the_score_is_raw_correctness():
    out = _responses([[5, 7, 7, 7, 7, 7], [6, EOS, PAD, PAD, PAD, PAD]], penalty=False)
    assert out.scores.tolist() == [1.0, -1.0]
