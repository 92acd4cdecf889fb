"""The rehearsal's stand-in model, data and CPU rollout server, driven directly (no Ray).

The server is exercised in-process here because its contract is verl's server contract (token-in/token-out
``generate``, ``update_weights``, ``wake_up``/``sleep``); ``tests/e2e/test_rehearse_*.py`` run it inside
verl's real trainer.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer
from verl.utils.reward_score.math_dapo import compute_score
from verl.workers.config import HFModelConfig, RolloutConfig

from dapo_verl.data.schema import dapo_prompt
from dapo_verl.rehearsal.bridges.cpu_rollout import CpuRolloutServer, ReplicaAsleepError, sample_next_token
from dapo_verl.rehearsal.data import generated_table
from dapo_verl.rehearsal.stand_in import ANSWER_TOKENS, build_stand_in, build_tokenizer

pytestmark = pytest.mark.verl

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    return build_stand_in(tmp_path_factory.mktemp("stand_in"))


@pytest.fixture
def server(stand_in):
    config = RolloutConfig(name="dapo_cpu", prompt_length=128, response_length=8, tensor_model_parallel_size=1)
    return CpuRolloutServer(config, HFModelConfig(path=str(stand_in)), replica_rank=0)


def _prompt_ids(stand_in, problem="What is 3 - 2?"):
    tok = AutoTokenizer.from_pretrained(stand_in)
    text = tok.apply_chat_template(
        [{"role": "user", "content": dapo_prompt(problem)}], add_generation_prompt=True, tokenize=False
    )
    return tok, tok(text)["input_ids"]


def _generate(server, ids, count, params=SAMPLING):
    async def run():
        return [await server.generate(ids, dict(params), f"r{i}") for i in range(count)]

    return asyncio.run(run())


def test_tokenizer_is_byte_level_with_qwen_chat_format(stand_in):
    tok, ids = _prompt_ids(stand_in)
    assert type(tok).__name__ == "Qwen2Tokenizer"
    text = "héllo\n\\boxed{42} ✓"
    assert tok.decode(tok(text)["input_ids"]) == text  # any text round-trips, byte by byte if need be
    assert tok.decode(ids).startswith("<|im_start|>system\nYou are Qwen")
    assert len(ids) < 128  # the learned merges keep a templated DAPO prompt short
    assert [len(tok(t)["input_ids"]) for t in ANSWER_TOKENS] == [1, 1]
    assert build_tokenizer().backend_tokenizer.to_str() == build_tokenizer().backend_tokenizer.to_str()


def test_generated_rows_are_scored_by_verl_math_dapo(stand_in):
    rows = generated_table(40, seed=0, split="train").to_pylist()
    assert {r["data_source"] for r in rows} == {"math_dapo"}
    assert {r["reward_model"]["ground_truth"] for r in rows} == {"1", "2"}
    for row in rows[:5]:
        answer = row["reward_model"]["ground_truth"]
        right = ANSWER_TOKENS[int(answer) - 1]  # decoded with skip_special_tokens, as the reward manager does
        wrong = ANSWER_TOKENS[2 - int(answer)]
        assert compute_score(right, answer)["acc"] is True
        assert compute_score(wrong, answer)["acc"] is False
        assert compute_score(ANSWER_TOKENS[0] + ANSWER_TOKENS[1], "2")["acc"] is True  # the last Answer: line


def test_stand_in_groups_are_mixed_or_all_wrong(server, stand_in):
    tok, ids = _prompt_ids(stand_in)
    outputs = _generate(server, ids, 64)
    acc = [compute_score(tok.decode(o.token_ids, skip_special_tokens=True), "1")["acc"] for o in outputs]
    assert 0.15 < sum(acc) / len(acc) < 0.55  # about 0.35 by construction
    lengths = Counter(len(o.token_ids) for o in outputs)
    assert lengths[8] > 0 and lengths[1] > 0  # some truncated at the budget, some stop at once
    assert all(len(o.log_probs) == len(o.token_ids) for o in outputs)


def test_same_weights_give_the_same_set_of_responses(server, stand_in):
    _, ids = _prompt_ids(stand_in)
    first = sorted(tuple(o.token_ids) for o in _generate(server, ids, 8))
    server._seeds.restart()  # as after a restart with the same weights
    second = sorted(tuple(o.token_ids) for o in _generate(server, ids, 8))
    assert first == second
    assert len(set(first)) > 1  # the n samples of a prompt differ


def test_server_refuses_to_generate_while_asleep(server, stand_in):
    _, ids = _prompt_ids(stand_in)
    asyncio.run(server.sleep())
    with pytest.raises(ReplicaAsleepError, match="weights and kv_cache are released"):
        _generate(server, ids, 1)
    asyncio.run(server.wake_up(tags=["weights"]))
    with pytest.raises(ReplicaAsleepError, match="kv_cache is released"):
        _generate(server, ids, 1)
    asyncio.run(server.wake_up(tags=["kv_cache"]))
    assert len(_generate(server, ids, 1)) == 1


def test_weight_update_loads_and_checks_names(server):
    state = {name: torch.zeros_like(t) for name, t in server.model.state_dict().items()}
    assert asyncio.run(server.update_weights(state, global_steps=3)) == len(state)
    status = asyncio.run(server.status())
    assert status["checksum"] == 0.0 and status["global_steps"] == 3 and status["weight_updates"] == 1
    with pytest.raises(ValueError, match="unknown names \\['lm_head.bias'\\]"):
        asyncio.run(server.update_weights({"lm_head.bias": torch.zeros(3)}))
    asyncio.run(server.sleep())
    with pytest.raises(ReplicaAsleepError):
        asyncio.run(server.update_weights(state))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(-1, 6), st.floats(0.05, 1.0), st.floats(0.1, 2.0))
def test_sampling_respects_top_k_and_top_p(seed, top_k, top_p, temperature):
    logits = torch.randn(12, generator=torch.Generator().manual_seed(seed))
    token, logp = sample_next_token(
        logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=torch.Generator().manual_seed(seed)
    )
    ranked = torch.argsort(logits, descending=True).tolist()
    if top_k > 0:
        assert ranked.index(token) < top_k
    probs = torch.softmax(logits / temperature, dim=-1)
    mass_before = float(probs[ranked[: ranked.index(token)]].sum())
    assert mass_before < top_p + 1e-6  # inside the nucleus
    assert logp == pytest.approx(float(torch.log(probs[token])), abs=1e-5)


def test_greedy_sampling_is_argmax():
    logits = torch.tensor([0.1, 2.0, -1.0])
    assert sample_next_token(logits, temperature=0, top_k=-1, top_p=1.0, generator=torch.Generator())[0] == 1


def _long_tail_server(stand_in, **options):
    config = RolloutConfig(
        name="dapo_cpu",
        prompt_length=128,
        response_length=64,
        tensor_model_parallel_size=1,
        engine_kwargs={"dapo_cpu": {"response_lengths": "long_tail", **options}},
    )
    return CpuRolloutServer(config, HFModelConfig(path=str(stand_in)), replica_rank=0)


def test_long_tail_lengths_are_mostly_short_with_a_tail_to_the_budget_and_log_probs_stay_the_models(stand_in):
    server = _long_tail_server(stand_in)
    outputs, asked = [], {}
    for problem in ("What is 3 - 2?", "What is 7 * 8?", "Solve x + 4 = 9.", "What is 2^10?", "Count to ten."):
        _, ids = _prompt_ids(stand_in, problem)
        for output in _generate(server, ids, 16):
            outputs.append(output)
            asked[id(output)] = ids
    lengths = sorted(len(o.token_ids) for o in outputs)
    median = lengths[len(lengths) // 2]
    assert median <= 16 and lengths[-1] >= 3 * median  # median near 0.15 x 64, a tail far beyond it
    eos = min(server.eos_ids)
    for output in outputs:  # each ends at its drawn length with EOS, or is truncated at the budget
        assert output.token_ids[-1] == eos or len(output.token_ids) == 64
        assert eos not in output.token_ids[:-1]
    output = max(outputs, key=lambda o: len(o.token_ids))  # the model's own log-probabilities, EOS forced or not
    ids = asked[id(output)]
    with torch.no_grad():
        logits = server.model(input_ids=torch.tensor([ids + output.token_ids])).logits[0, len(ids) - 1 : -1]
    expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(output.token_ids)[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor(output.log_probs), expected, atol=1e-4)


def test_abort_returns_what_was_generated_parks_new_requests_and_resume_lets_them_run(stand_in):
    config = RolloutConfig(
        name="dapo_cpu",
        prompt_length=128,
        response_length=512,
        tensor_model_parallel_size=1,
        engine_kwargs={"dapo_cpu": {"response_lengths": "long_tail", "median_fraction": 1.0}},
    )
    server = CpuRolloutServer(config, HFModelConfig(path=str(stand_in)), replica_rank=0)
    _, ids = _prompt_ids(stand_in)
    params = {**SAMPLING, "max_tokens": 512}

    async def run():
        running = asyncio.create_task(server.generate(ids, dict(params), "long"))
        await asyncio.sleep(0.2)
        aborted = await server.abort_all_requests()
        first = await running
        parked = asyncio.create_task(server.generate(ids, dict(params), "parked"))
        await asyncio.sleep(0.3)
        was_parked = not parked.done()
        await server.resume_generation()
        return aborted, first, was_parked, await parked

    aborted, first, was_parked, after = asyncio.run(run())
    assert aborted["aborted_count"] == 1 and first.stop_reason == "aborted"
    assert 0 < len(first.token_ids) < 512 and len(first.log_probs) == len(first.token_ids)
    assert was_parked and after.stop_reason == "completed"


def test_abort_with_reject_request_fails_new_requests_until_resumed(server, stand_in):
    _, ids = _prompt_ids(stand_in)

    async def run():
        await server.abort_all_requests(reject_request=True)
        with pytest.raises(RuntimeError, match="generation is paused with reject_request=True"):
            await server.generate(ids, dict(SAMPLING), "refused")
        await server.resume_generation()
        return await server.generate(ids, dict(SAMPLING), "after")

    assert asyncio.run(run()).stop_reason == "completed"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"response_lengths": "pareto"}, "response_lengths='pareto'; expected model"),
        ({"median_fraction": 0}, "median_fraction=0; expected a share"),
        ({"lengths": "long_tail"}, "unknown keys \\['lengths'\\]"),
    ],
)
def test_bad_length_options_are_refused_naming_the_key(stand_in, options, message):
    config = RolloutConfig(
        name="dapo_cpu",
        prompt_length=128,
        response_length=64,
        tensor_model_parallel_size=1,
        engine_kwargs={"dapo_cpu": options},
    )
    with pytest.raises(ValueError, match=f"actor_rollout_ref.rollout.engine_kwargs.dapo_cpu.*{message}"):
        CpuRolloutServer(config, HFModelConfig(path=str(stand_in)), replica_rank=0)
