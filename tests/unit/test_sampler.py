"""The batch replenisher with synthetic generate callbacks (fixed or drifting pass rates)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dapo_verl.config import SamplerConfig
from dapo_verl.core import DropReason, dynamic_group_mask
from dapo_verl.sampler import (
    BatchReplenisher,
    GroupResult,
    PromptStream,
    ShortfallError,
    budget_can_fill,
    request_size,
    round_request,
    step_prompt_budget,
)
from dapo_verl.sampler.simulation import SimulatedPolicy, drifting_pass_rates
from dapo_verl.state_io import load_state, save_state


def _fixed(rates):
    return lambda prompt_id, step: rates[prompt_id % len(rates)]


def _sampler(num_prompts=64, rates=(0.0, 0.5, 1.0, 0.3), seed=0, group_size=4, **overrides):
    config = SamplerConfig(**{"train_batch_size": 8, "seed": seed, **overrides})
    policy = SimulatedPolicy(_fixed(rates), group_size=group_size, seed=seed)
    return BatchReplenisher(config, num_prompts, policy), policy


def test_every_trained_group_is_informative_and_the_batch_is_full():
    sampler, _ = _sampler()
    for _ in range(10):
        batch = sampler.next_batch()
        assert len(batch.groups) == 8 and not batch.is_partial
        assert bool(dynamic_group_mask(batch.stacked_metric()).all())
        assert sampler.conservation_gap() == 0


def test_metrics_are_complete_and_prefilter_accuracy_is_unbiased():
    sampler, policy = _sampler(rates=(0.0, 1.0, 0.5))
    seen = []
    real = policy.__call__

    def spy(ids):
        groups = real(ids)
        seen.extend(float(g.metric.float().mean()) for g in groups)
        return groups

    sampler.generate = spy
    metrics = sampler.next_batch().metrics
    for key in (
        "train_step",
        "gen_rounds",
        "groups_generated",
        "groups_trained",
        "dropped/all_correct",
        "dropped/all_wrong",
        "prefilter_acc",
        "prefilter_score",
        "generated_per_trained",
        "wasted_response_tokens",
        "keep_rate_estimate",
        "carried_groups",
        "carried_staleness_mean",
        "prompts_skipped",
        "data_epoch",
        "truncated_fraction",
    ):
        assert f"dapo/sampler/{key}" in metrics
    assert metrics["dapo/sampler/prefilter_acc"] == pytest.approx(sum(seen) / len(seen))
    assert metrics["dapo/sampler/dropped/all_correct"] > 0 and metrics["dapo/sampler/dropped/all_wrong"] > 0
    trained = metrics["dapo/sampler/responses_trained"]
    assert metrics["dapo/sampler/generated_per_trained"] == pytest.approx(
        metrics["dapo/sampler/responses_generated"] / trained
    )


def test_same_seed_same_batches_and_metrics():
    a, _ = _sampler(seed=3, surplus="carry")
    b, _ = _sampler(seed=3, surplus="carry")
    for _ in range(6):
        batch_a, batch_b = a.next_batch(), b.next_batch()
        assert [g.prompt_id for g in batch_a.groups] == [g.prompt_id for g in batch_b.groups]
        assert batch_a.metrics == batch_b.metrics


def _round_trip(sampler, tmp_path):
    path = save_state(sampler.state_dict(), tmp_path / "sampler.safetensors")
    return load_state(path)


@pytest.mark.parametrize(
    "overrides",
    [
        {"surplus": "carry", "refill": "adaptive"},
        {"surplus": "discard", "refill": "barrier", "gen_batch_size": 12},
        {"surplus": "carry", "skip_uninformative": True},
        {"surplus": "carry", "skip_uninformative": True, "revisit_informative": True, "max_oversample_factor": 1.5},
    ],
)
def test_state_round_trip_gives_identical_next_batches(tmp_path, overrides):
    rates = drifting_pass_rates(64, seed=1, drift_per_step=0.05)
    config = SamplerConfig(train_batch_size=8, seed=5, **overrides)
    first_policy = SimulatedPolicy(rates, group_size=4, seed=9)
    original = BatchReplenisher(config, 64, first_policy)
    for _ in range(4):
        first_policy.step += 1
        original.next_batch()
    state = _round_trip(original, tmp_path)
    policy_state = first_policy._gen.get_state()

    resumed_policy = SimulatedPolicy(rates, group_size=4, seed=9)
    resumed_policy._gen.set_state(policy_state)
    resumed_policy.step = first_policy.step
    resumed = BatchReplenisher(config, 64, resumed_policy)
    resumed.load_state_dict(state)
    assert resumed.conservation_gap() == 0
    for _ in range(4):
        first_policy.step += 1
        resumed_policy.step += 1
        expected, actual = original.next_batch(), resumed.next_batch()
        assert [g.prompt_id for g in actual.groups] == [g.prompt_id for g in expected.groups]
        for g_actual, g_expected in zip(actual.groups, expected.groups):
            assert torch.equal(g_actual.metric, g_expected.metric)
        assert actual.metrics == expected.metrics


def test_a_version_1_state_resumes_with_fresh_prompt_histories(tmp_path):
    sampler, _ = _sampler(surplus="carry", skip_uninformative=True)
    for _ in range(3):
        sampler.next_batch()
    state = _round_trip(sampler, tmp_path)
    stream = {
        k: v for k, v in state["stream"].items() if k not in ("history", "revisit", "handed_out", "prompts_revisited")
    }
    old = {
        **state,
        "version": 1,
        "stream": {**stream, "streak": [[1, 2], [5, 1]]},
        "counters": {k: v for k, v in state["counters"].items() if k != "prompts_revisited"},
    }
    resumed, _ = _sampler(surplus="carry", skip_uninformative=True)
    resumed.load_state_dict(old)
    assert resumed.counters == sampler.counters and len(resumed.carried) == len(sampler.carried)
    assert resumed.stream.position == sampler.stream.position and resumed.stream.history_size == 0
    assert resumed.conservation_gap() == 0
    assert resumed.next_batch().step == 4
    with pytest.raises(ValueError, match=r"version 7 is not one of \[1, 2, 3\]"):
        resumed.load_state_dict({**state, "version": 7})


def test_round_limit_error_says_keep_rate_and_knobs():
    sampler, _ = _sampler(rates=(0.0, 0.0, 0.0, 0.5), max_num_gen_batches=1, gen_batch_size=4)
    with pytest.raises(
        ShortfallError,
        match=r"has \d of 8 groups .* after 1 rounds .*keep rate \d+\.\d%.*"
        r"all-correct or all-wrong.*raise algorithm.filter_groups."
        r"max_num_gen_batches.*on_shortfall=partial",
    ):
        sampler.next_batch()
    assert sampler.conservation_gap() == 0


def test_round_limit_partial_trains_on_what_was_found():
    sampler, _ = _sampler(
        rates=(0.0, 0.0, 0.0, 0.5), max_num_gen_batches=2, gen_batch_size=4, on_shortfall="partial", refill="barrier"
    )  # 2 rounds of 4 prompts cannot fill 8
    batch = sampler.next_batch()
    assert batch.is_partial and 0 < len(batch.groups) < 8
    assert batch.metrics["dapo/sampler/partial"] == 1.0
    assert batch.metrics["dapo/sampler/gen_rounds"] == 2
    assert bool(dynamic_group_mask(batch.stacked_metric()).all())
    assert sampler.conservation_gap() == 0


def test_hopeless_data_never_loops_forever():
    sampler, policy = _sampler(rates=(1.0,), max_num_gen_batches=3, on_shortfall="partial")
    first = sampler.next_batch()  # an estimate from 8-16 groups is not trusted yet (N_est = 45): the budget is spent
    assert first.groups == [] and policy.calls == 3
    assert first.metrics["dapo/sampler/prompts_requested"] == step_prompt_budget(sampler.config) == 3 * 8
    assert sampler.next_batch().metrics["dapo/sampler/gen_rounds"] == 3  # 32 and 40 groups seen: still too few
    third = sampler.next_batch()  # 56 groups seen: nothing informative, no reason to spend the budget any more
    assert third.groups == [] and third.metrics["dapo/sampler/prompts_requested"] == 8 and policy.calls == 7
    barrier, policy = _sampler(rates=(1.0,), max_num_gen_batches=3, on_shortfall="partial", refill="barrier")
    assert barrier.next_batch().groups == [] and policy.calls == 3  # verl-recipe: every round up to the limit


@pytest.mark.parametrize("refill", ["adaptive", "barrier"])
def test_a_step_never_generates_more_than_its_prompt_budget(refill):
    # keep rate ~3%: adaptive rounds would ask ~4x the missing groups each; the budget caps the step instead
    sampler, _ = _sampler(
        num_prompts=500,
        rates=(0.5,) + (1.0,) * 31,
        refill=refill,
        gen_batch_size=12,
        max_num_gen_batches=4,
        on_shortfall="partial",
    )
    budget = step_prompt_budget(sampler.config)
    assert budget == 4 * 12
    for _ in range(10):
        metrics = sampler.next_batch().metrics
        assert metrics["dapo/sampler/prompts_requested"] <= budget
        assert metrics["dapo/sampler/gen_rounds"] <= 4
    assert sampler.conservation_gap() == 0


def test_budget_is_rounds_times_the_larger_of_gen_and_train_batch():
    assert step_prompt_budget(SamplerConfig(train_batch_size=8, gen_batch_size=4, max_num_gen_batches=3)) == 24
    assert step_prompt_budget(SamplerConfig(train_batch_size=8, gen_batch_size=20, max_num_gen_batches=3)) == 60
    assert step_prompt_budget(SamplerConfig(train_batch_size=8, enable=False)) == 8


def test_when_the_budget_cannot_fill_the_batch_a_partial_step_spends_one_round_and_says_why():
    """All-correct prompts: once the estimate (0) rests on N_est = 45 groups, a step stops after its probe round."""
    sampler, policy = _sampler(
        num_prompts=500,
        rates=(1.0,),
        gen_batch_size=12,
        on_shortfall="partial",
        max_num_gen_batches=4,
        skip_uninformative=False,
        revisit_informative=False,
    )
    first = sampler.next_batch()  # 36 groups seen after 3 rounds: too few to trust the estimate, so 4 rounds
    assert first.is_partial and first.metrics["dapo/sampler/gen_rounds"] == 4
    second = sampler.next_batch()
    assert second.is_partial and policy.calls == 5 and sampler.conservation_gap() == 0
    assert second.metrics["dapo/sampler/gen_rounds"] == 1 and second.metrics["dapo/sampler/prompts_requested"] == 12


def test_with_on_shortfall_error_a_step_spends_its_whole_budget_before_raising():
    sampler, policy = _sampler(
        num_prompts=500,
        rates=(1.0,),
        gen_batch_size=12,
        max_num_gen_batches=4,
        skip_uninformative=False,
        revisit_informative=False,
    )
    with pytest.raises(
        ShortfallError,
        match=r"0 of 8 groups for step 1 after 4 rounds and 48 prompts \(the round "
        r"limit .*skip_uninformative=true; or set .*on_shortfall=partial",
    ):
        sampler.next_batch()
    assert policy.calls == 4 and sampler.conservation_gap() == 0


def test_a_small_batch_whose_first_round_holds_no_informative_group_refills_instead_of_raising():
    """4 prompts a step: a first round of 4 uninformative groups (estimate 0 from 4 groups) must not end the run."""
    config = SamplerConfig(train_batch_size=4, seed=0)
    calls = []

    def generate(prompt_ids):
        informative = bool(calls)  # the first round: all wrong; later: half right
        calls.append(list(prompt_ids))
        metric = torch.tensor([1, 0, 1, 0]) if informative else torch.zeros(4, dtype=torch.long)
        return [
            GroupResult(
                prompt_id=i,
                metric=metric,
                response_lengths=torch.full((4,), 5),
                truncated=torch.zeros(4, dtype=torch.bool),
            )
            for i in prompt_ids
        ]

    sampler = BatchReplenisher(config, 100, generate)
    batch = sampler.next_batch()
    assert len(batch.groups) == 4 and len(calls) >= 2 and len(calls[0]) == 4
    assert batch.metrics["dapo/sampler/dropped/all_wrong"] == 4 and sampler.conservation_gap() == 0


@pytest.mark.parametrize("on_shortfall", ["error", "partial"])
def test_at_four_prompts_a_step_no_step_stops_early_while_its_budget_remains(on_shortfall):
    """Over many seeded runs at a 34% informative rate, every step either fills its batch or has spent its budget."""
    short = []
    for seed in range(40):
        config = SamplerConfig(train_batch_size=4, seed=seed, on_shortfall=on_shortfall)
        policy = SimulatedPolicy(_fixed((0.1,)), group_size=4, seed=seed)  # 34% of groups informative
        sampler = BatchReplenisher(config, 200, policy)
        for _ in range(15):
            try:
                metrics = sampler.next_batch().metrics
            except ShortfallError as error:
                assert "the step's budget" in str(error)
                short.append(seed)
                break
            if metrics["dapo/sampler/partial"]:
                assert metrics["dapo/sampler/prompts_requested"] == step_prompt_budget(config)
                short.append(seed)
    assert len(short) <= 1  # only an exhausted budget ends a step short (P ~ 1e-4 a step here)


def test_budget_can_fill_compares_the_expected_yield_of_the_rest_of_the_budget():
    config = SamplerConfig(train_batch_size=16, gen_batch_size=32, max_num_gen_batches=4)
    assert budget_can_fill(config, 16, 0.125, 128) and not budget_can_fill(config, 16, 0.12, 128)
    assert budget_can_fill(config, 16, None, 128)  # before the first round
    assert budget_can_fill(dataclasses.replace(config, refill="barrier"), 16, 0.0, 128)
    assert round_request(config, 16, 0.01, 128) == 32  # one round of gen_batch_size, not 4x the missing groups
    assert round_request(config, 16, 0.5, 128) > 32


def test_carry_keeps_surplus_for_the_next_step_and_drops_stale_groups():
    sampler, _ = _sampler(rates=(0.5,), surplus="carry", gen_batch_size=20, refill="barrier", max_staleness_steps=1)
    first = sampler.next_batch()
    carried_ids = [g.prompt_id for _, g in sampler.carried]
    assert first.metrics["dapo/sampler/carried_groups"] == len(carried_ids) > 8
    second = sampler.next_batch()
    assert [g.prompt_id for g in second.groups] == carried_ids[:8]
    assert second.metrics["dapo/sampler/gen_rounds"] == 0
    assert second.metrics["dapo/sampler/carried_staleness_max"] == 1
    third = sampler.next_batch()  # leftovers from step 1 are now 2 steps old
    assert third.metrics["dapo/sampler/dropped/stale"] == len(carried_ids) - 8
    assert sampler.conservation_gap() == 0


def test_discard_counts_surplus_as_dropped():
    sampler, _ = _sampler(rates=(0.5,), gen_batch_size=20, refill="barrier")
    metrics = sampler.next_batch().metrics
    assert metrics["dapo/sampler/dropped/surplus"] > 0
    assert metrics["dapo/sampler/carried_groups"] == 0
    assert sampler.conservation_gap() == 0


def test_disabled_filter_trains_on_exactly_one_round_of_unfiltered_groups():
    sampler, policy = _sampler(enable=False, rates=(0.0, 1.0))
    batch = sampler.next_batch()
    assert len(batch.groups) == 8 and policy.calls == 1
    assert not bool(dynamic_group_mask(batch.stacked_metric()).any())
    assert batch.metrics["dapo/sampler/generated_per_trained"] == 1.0


def test_adaptive_refill_needs_fewer_rounds_than_barrier_at_low_keep_rate():
    def rounds(refill):
        sampler, _ = _sampler(
            num_prompts=400,
            rates=(0.5, 0.0),
            refill=refill,  # keep rate ~0.44
            gen_batch_size=8,
            train_batch_size=16,
            max_num_gen_batches=50,
        )
        return sum(sampler.next_batch().metrics["dapo/sampler/gen_rounds"] for _ in range(20)) / 20

    assert rounds("adaptive") < rounds("barrier")
    assert rounds("adaptive") <= 1.5


def test_request_size_grows_as_keep_rate_falls_and_is_capped():
    config = SamplerConfig(train_batch_size=100, max_oversample_factor=4.0)
    sizes = [request_size(config, 100, p) for p in (1.0, 0.8, 0.5, 0.3, 0.1)]
    assert sizes == sorted(sizes) and sizes[0] == 100
    assert sizes[-1] == request_size(config, 100, 0.25) == 447  # floored at keep rate 1/4: 4x plus the margin
    assert request_size(config, 100, None) == 100  # first round: gen_batch_size (default train_batch_size)
    barrier = dataclasses.replace(config, refill="barrier", gen_batch_size=300)
    assert request_size(barrier, 3, 0.5) == 300


def test_malformed_generate_output_is_rejected():
    config = SamplerConfig(train_batch_size=2)

    def wrong_count(ids):
        return []

    with pytest.raises(ValueError, match="generate returned 0 groups for 2 prompts"):
        BatchReplenisher(config, 10, wrong_count).next_batch()

    def singleton(ids):
        return [GroupResult(i, torch.tensor([True]), torch.tensor([3]), torch.tensor([False])) for i in ids]

    with pytest.raises(ValueError, match=r"expected \(G,\) with G >= 2"):
        BatchReplenisher(config, 10, singleton).next_batch()


def test_stream_visits_every_prompt_once_per_epoch_in_seeded_order():
    stream = PromptStream(10, seed=1)
    first, _ = stream.take(10)
    second, _ = stream.take(10)
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second and stream.epoch == 1
    again = PromptStream(10, seed=1)
    assert again.take(10)[0] == first


def test_skipping_never_excludes_a_prompt_for_good():
    stream = PromptStream(4, seed=0, skip_uninformative=True, max_skip_probability=0.9, smoothing_groups=50)
    generated = 0
    for _ in range(300):
        ids, _ = stream.take(4)
        generated += ids.count(0)
        for pid in ids:
            stream.record(pid, DropReason.ALL_CORRECT if pid == 0 else DropReason.KEEP)
    assert 0.8 < stream.skip_probability(0) <= 0.9
    assert 0 < generated < 300 * 0.5  # generated near the 10% floor, never excluded
    assert stream.prompts_skipped > 0
    assert stream.history_size <= 4


def test_skip_history_reduces_generation_for_uninformative_prompts():
    def waste(skip):
        sampler, _ = _sampler(
            num_prompts=40, rates=(0.0, 1.0, 0.5, 1.0), skip_uninformative=skip, max_num_gen_batches=30
        )
        for _ in range(30):
            sampler.next_batch()
        return sampler.counters["responses_generated"] / sampler.counters["responses_trained"]

    assert waste(True) < waste(False)


def test_state_of_a_different_prompt_source_is_refused(tmp_path):
    sampler, _ = _sampler(num_prompts=64)
    sampler.next_batch()
    other, _ = _sampler(num_prompts=65)
    with pytest.raises(ValueError, match="covers 64 prompts but the prompt source has 65"):
        other.load_state_dict(_round_trip(sampler, tmp_path))


def test_partial_shortfall_is_an_info_line_that_names_the_right_knobs(caplog):
    sampler, _ = _sampler(rates=(0.0, 0.0, 0.0, 0.5), max_num_gen_batches=1, on_shortfall="partial")
    with caplog.at_level("INFO", logger="dapo_verl.sampler.replenisher"):
        sampler.next_batch()
    assert [r.levelname for r in caplog.records] == ["INFO"]  # chosen by the user and recorded as a metric
    message = caplog.records[0].getMessage()
    assert "max_oversample_factor" in message and "Training on the" in message
    assert "on_shortfall=partial" not in message  # it already is
