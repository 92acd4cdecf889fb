"""BatchReplenisher checks what generate returns and what load_state_dict is given (dapo_verl/sampler/contracts.py).

A broken callback or a damaged state must end in a TypeError or ValueError naming the prompt, the field and the
fix -- never an AttributeError from inside the sampler -- and a failed load must leave the sampler unchanged.
"""

from __future__ import annotations

import json

import pytest
import torch

from dapo_verl.config import SamplerConfig
from dapo_verl.sampler import BatchReplenisher, GroupResult

CONFIG = SamplerConfig(train_batch_size=2)


def _group(prompt_id, **fields):
    values = {
        "metric": torch.tensor([0.0, 1.0]),
        "response_lengths": torch.tensor([3, 4]),
        "truncated": torch.tensor([False, False]),
        **fields,
    }
    return GroupResult(prompt_id, **values)


def _first_batch(generate):
    return BatchReplenisher(CONFIG, 10, generate).next_batch()


@pytest.mark.parametrize(
    ("generate", "error", "words"),
    [
        (lambda ids: None, TypeError, "generate returned NoneType; it must return a list of GroupResult"),
        (lambda ids: 3, TypeError, "generate returned int"),
        (lambda ids: {i: _group(i) for i in ids}, TypeError, "generate returned dict"),
        (lambda ids: [{"prompt_id": i} for i in ids], TypeError, r"generate returned a dict for prompt \d+"),
        (lambda ids: [_group(i, metric=[0.0, 1.0]) for i in ids], TypeError, r"metric is a list; it must be a \(G,\)"),
        (lambda ids: [_group(i, response_lengths=[3, 4]) for i in ids], TypeError, "response_lengths is a list"),
        (lambda ids: [_group(str(i)) for i in ids], ValueError, r"a group for prompt '\d+' where prompt \d+ was"),
        (
            lambda ids: [_group(i, response_lengths=torch.tensor([-3, 4])) for i in ids],
            ValueError,
            r"response_lengths holds \[-3, 4\].*non-negative integer",
        ),
        (
            lambda ids: [_group(i, response_lengths=torch.tensor([3.5, 4.0])) for i in ids],
            ValueError,
            "non-negative integer token counts",
        ),
        (lambda ids: [_group(i, truncated=torch.tensor([2, 0])) for i in ids], ValueError, r"truncated holds \[2, 0\]"),
        (lambda ids: [_group(i, scores=torch.tensor([1.0])) for i in ids], ValueError, r"scores has shape \(1,\)"),
        (
            lambda ids: [_group(i, scores=torch.tensor([1.0, float("nan")])) for i in ids],
            ValueError,
            "scores holds .*must be finite",
        ),
        (lambda ids: [_group(i) for i in ids][:-1], ValueError, "generate returned 1 groups for 2 prompts"),
        (
            lambda ids: [_group(i, metric=torch.empty(2, device="meta")) for i in ids],
            ValueError,
            r"prompt \d+: metric is a meta tensor \(no data\).*materialized CPU or GPU tensors",
        ),
        (
            lambda ids: [_group(i, response_lengths=torch.empty(2, dtype=torch.long, device="meta")) for i in ids],
            ValueError,
            r"prompt \d+: response_lengths is a meta tensor",
        ),
        (
            lambda ids: [_group(i, metric=torch.tensor([1j, 1 + 0j])) for i in ids],
            TypeError,
            r"prompt \d+: metric has dtype torch.complex64; it must hold real values",
        ),
        (
            lambda ids: [_group(i, scores=torch.tensor([1j, 0j])) for i in ids],
            TypeError,
            r"prompt \d+: scores has dtype torch.complex64",
        ),
    ],
)
def test_a_broken_generate_callback_is_named(generate, error, words):
    with pytest.raises(error, match=words):
        _first_batch(generate)


def test_a_tuple_or_an_iterator_of_groups_is_accepted():
    assert len(_first_batch(lambda ids: tuple(_group(i) for i in ids)).groups) == 2
    assert len(_first_batch(lambda ids: iter([_group(i) for i in ids])).groups) == 2


def _loaded_sampler():
    sampler = BatchReplenisher(CONFIG, 10, lambda ids: [_group(i) for i in ids])
    sampler.next_batch()
    return sampler


@pytest.mark.parametrize(
    ("damage", "error", "words"),
    [
        (lambda state: None, TypeError, "the sampler state is NoneType, not a mapping"),
        (lambda state: [], TypeError, "the sampler state is list"),
        (lambda state: {}, ValueError, "Sampler state version None"),
        (lambda state: {**state, "counters": None}, ValueError, "'counters' is a NoneType"),
        (lambda state: {k: v for k, v in state.items() if k != "stream"}, ValueError, "'stream' is missing"),
        (lambda state: {**state, "keep_rate_estimate": "high"}, ValueError, "'keep_rate_estimate' is a str"),
        (lambda state: {**state, "carried": [{"prompt_id": 1}]}, ValueError, "carried group 0 lacks"),
        (
            lambda state: {**state, "stream": {"num_prompts": 10}},
            ValueError,
            r"the PromptStream state lacks \['epoch', 'position'",
        ),
        (
            lambda state: {**state, "counters": {**state["counters"], "groups_generated": -5}},
            ValueError,
            r"counters\['groups_generated'\] is -5; it must be a finite number >= 0",
        ),
        (
            lambda state: {**state, "dropped": {**state["dropped"], "all_wrong": 1.5}},
            ValueError,
            r"dropped\['all_wrong'\] is 1.5; it must be an integer >= 0",
        ),
        (lambda state: {**state, "keep_rate_estimate": 1.5}, ValueError, "'keep_rate_estimate' is a float"),
        (
            lambda state: {**state, "stream": {**state["stream"], "prompts_consumed": -1}},
            ValueError,
            r"PromptStream state's 'prompts_consumed' is -1; expected an integer >= 0",
        ),
        (
            lambda state: {**state, "stream": {**state["stream"], "position": 11}},
            ValueError,
            r"'position' is 11; expected an integer in \[0, 10\]",
        ),
        (
            lambda state: {**state, "stream": {**state["stream"], "revisit": [3, 10]}},
            ValueError,
            r"'revisit' is 10; expected an integer in \[0, 9\]",
        ),
        (
            lambda state: {**state, "stream": {**state["stream"], "rng": "seed"}},
            ValueError,
            "'rng' is 'seed'; expected the uint8 tensor",
        ),
        (
            lambda state: {**state, "stream": {**state["stream"], "history": {"bogus": 1}}},
            ValueError,
            r"the PromptHistory state has unknown keys \['bogus'\]",
        ),
        (
            lambda state: {**state, "stream": {**state["stream"], "history": {"generated": [-1.0] * 10}}},
            ValueError,
            r"'generated\[0\]' is -1.0; expected a finite number >= 0",
        ),
        (lambda state: {**state, "stream": {**state["stream"], "num_prompts": 11}}, ValueError, "covers 11 prompts"),
    ],
)
def test_a_damaged_state_is_refused_and_the_sampler_is_left_as_it_was(damage, error, words):
    sampler = _loaded_sampler()
    before = json.dumps(sampler.state_dict(), default=str, sort_keys=True)
    with pytest.raises(error, match=words):
        sampler.load_state_dict(damage(sampler.state_dict()))
    assert json.dumps(sampler.state_dict(), default=str, sort_keys=True) == before
    assert len(sampler.next_batch().groups) == 2
