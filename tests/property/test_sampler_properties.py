"""Randomised invariants of the batch replenisher over configurations and pass rates (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_verl.config import SamplerConfig
from dapo_verl.core import dynamic_group_mask
from dapo_verl.sampler import BatchReplenisher, ShortfallError, max_request_size, step_prompt_budget
from dapo_verl.sampler.simulation import SimulatedPolicy

configs = st.fixed_dictionaries({
    "train_batch_size": st.integers(1, 12),
    "gen_batch_size": st.one_of(st.none(), st.integers(1, 24)),
    "max_num_gen_batches": st.integers(1, 6),
    "refill": st.sampled_from(["barrier", "adaptive"]),
    "surplus": st.sampled_from(["discard", "carry"]),
    "max_staleness_steps": st.integers(1, 3),
    "on_shortfall": st.sampled_from(["error", "partial"]),
    "skip_uninformative": st.booleans(),
    "revisit_informative": st.booleans(),
    "max_oversample_factor": st.sampled_from([1.0, 2.0, 4.0]),
    "enable": st.booleans(),
    "seed": st.integers(0, 1000),
})


@settings(max_examples=80, deadline=None)
@given(overrides=configs, rates=st.lists(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]), min_size=1, max_size=6),
       group_size=st.integers(2, 6), num_prompts=st.integers(1, 40), steps=st.integers(1, 8))
def test_batches_are_informative_full_or_flagged_and_conserved(overrides, rates, group_size, num_prompts, steps):
    config = SamplerConfig(**overrides)
    policy = SimulatedPolicy(lambda pid, step: rates[pid % len(rates)], group_size=group_size, seed=config.seed)
    sampler = BatchReplenisher(config, num_prompts, policy)
    for _ in range(steps):
        calls_before = policy.calls
        try:
            batch = sampler.next_batch()
        except ShortfallError:
            assert config.on_shortfall == "error"
            assert sampler.conservation_gap() == 0
            return
        assert policy.calls - calls_before <= config.max_num_gen_batches
        assert batch.metrics["dapo/sampler/prompts_requested"] <= step_prompt_budget(config)
        assert 0 <= batch.metrics["dapo/sampler/pool_exhausted_fraction"] <= 1
        assert sampler.conservation_gap() == 0
        assert len(batch.groups) <= config.train_batch_size
        assert batch.is_partial == (len(batch.groups) < config.train_batch_size)
        if batch.is_partial:
            assert config.on_shortfall == "partial"
        if config.enable and batch.groups:
            assert bool(dynamic_group_mask(batch.stacked_metric()).all())
        staleness = batch.metrics["dapo/sampler/carried_staleness_max"]
        assert staleness <= config.max_staleness_steps
        largest_round = max_request_size(config, config.train_batch_size)
        assert len(sampler.carried) <= config.max_staleness_steps * config.max_num_gen_batches * largest_round
        assert sampler.stream.history_size <= num_prompts
        assert sampler.stream.revisits_waiting <= config.train_batch_size
