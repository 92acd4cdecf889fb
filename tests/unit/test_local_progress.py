"""The progress bar of `dapo-verl train` shows measured values, never '-' for a metric it has seen."""

from __future__ import annotations

import doctest

from dapo_verl.local import train
from dapo_verl.local.train import progress_postfix


def test_a_step_without_an_update_keeps_the_last_entropy_and_length():
    history = [
        {"step": 0, "data": {"val-core/copy3/acc/mean@1": 0.0}},
        {
            "step": 1,
            "data": {
                "actor/entropy": 2.5,
                "response_length/mean": 5.25,
                "dapo/sampler/keep_rate": 0.5,
                "dapo/sampler/prefilter_acc": 0.1,
            },
        },
        {"step": 2, "data": {"dapo/sampler/keep_rate": 0.0, "dapo/sampler/prefilter_acc": 1.0}},  # nothing trained
        {
            "step": 3,
            "data": {
                "actor/entropy": None,
                "response_length/mean": 2.0,
                "dapo/sampler/keep_rate": 0.25,
                "dapo/sampler/prefilter_acc": 0.9,
            },
        },  # no loss token: entropy undefined
    ]
    assert progress_postfix(history, "copy3") == {
        "val_acc": "0.00",
        "acc": "0.90",
        "keep": "0.25",
        "ent": "2.50",
        "len": "2.0",
    }


def test_docstring_examples_run():
    result = doctest.testmod(train, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
