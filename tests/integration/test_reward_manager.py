"""The dapo_verl reward manager on verl DataProto items: shaping, raw acc, verl parity and start-up errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager  # noqa: E402
from verl.trainer.ppo.reward import load_reward_manager  # noqa: E402

from dapo_verl.adapter.reward import DapoRewardManager, overlong_metrics  # noqa: E402
from dapo_verl.adapter.transforms import apply_overlong_filtering  # noqa: E402

MAX_LEN = 8


def _config(**reward_kwargs):
    return OmegaConf.create({"data": {"max_response_length": MAX_LEN}, "reward": {"reward_kwargs": reward_kwargs}})


def _item(tokenizer, text, answer="7", *, length=None, eos=True):
    ids = tokenizer(text)["input_ids"]
    if eos:
        ids = [*ids, tokenizer.eos_token_id]
    if length is not None:  # lengthen the response with leading filler words up to `length` tokens
        filler = tokenizer.convert_tokens_to_ids("the")
        ids = [filler] * (length - len(ids)) + ids
    ids = ids[:MAX_LEN]
    responses = torch.full((1, MAX_LEN), tokenizer.pad_token_id)
    responses[0, : len(ids)] = torch.tensor(ids)
    attention = torch.cat([torch.ones(1, 2, dtype=torch.long), (responses != tokenizer.pad_token_id).long()], dim=1)
    return DataProto.from_dict(
        tensors={"prompts": torch.ones(1, 2, dtype=torch.long), "responses": responses, "attention_mask": attention},
        non_tensors={
            "data_source": np.array(["math_dapo"], dtype=object),
            "reward_model": np.array([{"ground_truth": answer}], dtype=object),
            "extra_info": np.array([{}], dtype=object),
        },
    )


def _run(manager, data):
    return manager.loop.run_until_complete(manager.run_single(data))


def test_correct_short_answer_gets_full_reward_and_raw_acc(tiny_tokenizer):
    manager = DapoRewardManager(_config(overlong_tokens=4), tiny_tokenizer, None)
    out = _run(manager, _item(tiny_tokenizer, "Answer: 7"))
    assert out["reward_score"] == 1.0
    assert out["reward_extra_info"]["acc"] is True
    assert out["reward_extra_info"]["overlong_penalty"] == 0.0
    assert out["reward_extra_info"]["truncated"] is False


@pytest.mark.parametrize(("length", "penalty"), [(4, 0.0), (5, -0.25), (6, -0.5), (8, -1.0)])
def test_penalty_inside_the_buffer_and_at_the_limit(tiny_tokenizer, length, penalty):
    manager = DapoRewardManager(_config(overlong_tokens=4, overlong_penalty_factor=1.0), tiny_tokenizer, None)
    out = _run(manager, _item(tiny_tokenizer, "Answer: 7", length=length))
    info = out["reward_extra_info"]
    assert info["response_length"] == length
    assert info["overlong_penalty"] == pytest.approx(penalty)
    assert out["reward_score"] == pytest.approx(1.0 + penalty)
    assert info["acc"] is True  # raw correctness is untouched by the length penalty
    assert info["overlong"] is (penalty < 0)


def test_full_length_without_eos_is_truncated_with_eos_is_not(tiny_tokenizer):
    manager = DapoRewardManager(_config(overlong_tokens=4), tiny_tokenizer, None)
    cut = _run(manager, _item(tiny_tokenizer, "Answer: 7", length=MAX_LEN, eos=False))["reward_extra_info"]
    done = _run(manager, _item(tiny_tokenizer, "Answer: 7", length=MAX_LEN, eos=True))["reward_extra_info"]
    assert cut["truncated"] is True and done["truncated"] is False


def test_matches_verl_dapo_manager_up_to_the_limit(tiny_tokenizer):
    ours = DapoRewardManager(_config(overlong_tokens=4, overlong_penalty_factor=0.5), tiny_tokenizer, None)
    verl_cfg = _config(
        overlong_buffer_cfg={"enable": True, "len": 4, "penalty_factor": 0.5, "log": True}, max_resp_len=MAX_LEN
    )
    theirs = DAPORewardManager(verl_cfg, tiny_tokenizer, None)
    for text, length in (("Answer: 7", 3), ("Answer: 3", 6), ("wrong", 7), ("Answer: 7", 8)):
        a = _run(ours, _item(tiny_tokenizer, text, length=length))
        b = _run(theirs, _item(tiny_tokenizer, text, length=length))
        assert a["reward_score"] == pytest.approx(b["reward_score"])


def test_quadratic_schedule_and_verl_alias_keys(tiny_tokenizer):
    quad = DapoRewardManager(_config(overlong_tokens=4, overlong_schedule="quadratic"), tiny_tokenizer, None)
    assert _run(quad, _item(tiny_tokenizer, "Answer: 7", length=6))["reward_score"] == pytest.approx(0.75)
    alias = DapoRewardManager(
        _config(overlong_buffer_cfg={"enable": True, "len": 2, "penalty_factor": 1.0}), tiny_tokenizer, None
    )
    assert alias.overlong.overlong_tokens == 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"overlong_schedule": "cubic"}, "overlong_schedule='cubic' is not one of"),
        ({"overlong_penalty_factor": -1.0}, "overlong_penalty_factor=-1.0 must be >= 0.0"),
        ({"overlong_tokens": 16}, "overlong_tokens=16 exceeds data.max_response_length=8"),
        ({"overlong_tokens": 0}, "overlong_tokens=0 must be > 0"),
        ({"overlong_tokens": 4, "overlong_buffer_cfg": {"len": 3}}, "contradicts"),
    ],
)
def test_misconfiguration_fails_at_start_up_naming_the_key(tiny_tokenizer, kwargs, match):
    with pytest.raises(ValueError, match=match):
        DapoRewardManager(_config(**kwargs), tiny_tokenizer, None)


def test_missing_max_response_length_is_a_start_up_error(tiny_tokenizer):
    with pytest.raises(ValueError, match="needs the response budget.*Set data.max_response_length"):
        DapoRewardManager(OmegaConf.create({"reward": {"reward_kwargs": {}}}), tiny_tokenizer, None)


def test_verl_loads_the_manager_by_its_registered_name(tiny_tokenizer):
    config = _config(overlong_tokens=4)
    config.reward.reward_manager = {"source": "register", "name": "dapo_verl"}
    manager = load_reward_manager(config, tiny_tokenizer)
    assert isinstance(manager, DapoRewardManager)
    assert _run(manager, _item(tiny_tokenizer, "Answer: 3"))["reward_extra_info"]["acc"] is False


def test_overlong_metrics_and_filtering_transform(tiny_tokenizer):
    stats = overlong_metrics(
        {"overlong_penalty": np.array([0.0, -0.5, -1.0, 0.0]), "truncated": np.array([False, False, True, False])}
    )
    assert stats == {
        "dapo/overlong/in_buffer_fraction": 0.5,
        "dapo/overlong/truncated_fraction": 0.25,
        "dapo/overlong/penalty_mean": -0.375,
    }
    assert overlong_metrics({}) == {}
    batch = DataProto.concat(
        [
            _item(tiny_tokenizer, "Answer: 7", length=MAX_LEN, eos=False),
            _item(tiny_tokenizer, "Answer: 7", length=MAX_LEN, eos=True),
            _item(tiny_tokenizer, "Answer: 7"),
        ]
    )
    metrics = apply_overlong_filtering(batch, tiny_tokenizer.eos_token_id)
    assert batch.batch["response_mask"].sum(-1).tolist() == [0, MAX_LEN, 3]
    assert metrics["dapo/overlong/filtered_fraction"] == pytest.approx(1 / 3)
