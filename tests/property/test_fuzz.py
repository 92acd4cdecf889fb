"""Fuzzing of every public core function, the config entry point and the sampler's callback contract."""

from __future__ import annotations

import pytest

from tools.reliability.fuzz import CASE_SHARE, FUZZ_TARGETS, cases_for, run_fuzz


def _check(results, cases):
    assert [r.target for r in results] == list(FUZZ_TARGETS)
    for result in results:
        assert result.tried == cases_for(result.target, cases)
        assert result.correct + result.clear_errors == result.tried, result.failures[:5]
        assert result.correct > 0 and result.clear_errors > 0  # both paths are exercised
        assert result.slowest_s < (60.0 if result.target in CASE_SHARE else 5.0)  # no case hangs


def test_fuzz_quick():
    _check(run_fuzz(cases_per_target=120, seed=11), 120)


def test_a_name_counts_only_as_a_whole_word_or_key():
    from tools.reliability.fuzz import names_exactly

    assert not names_exactly("old_logp has NaN at index (0, 1)", "logp")
    assert names_exactly("logp has shape (2, 3) but mask has shape (2, 4)", "logp")
    assert names_exactly("algorithm.group_token_mean='' must be a boolean", "algorithm.group_token_mean")
    assert not names_exactly("algorithm.group_token_mean_x=1", "algorithm.group_token_mean")
    assert not names_exactly("algorithm.filter_groups.enable='x' must be a boolean", "filter_groups.enable")


def _run_target(name, cases=300, seed=3):
    import random

    from tools.reliability.fuzz import _fuzz_target

    return _fuzz_target(name, FUZZ_TARGETS[name], cases, random.Random(seed))


def test_an_invalid_config_value_that_is_accepted_is_a_failure(monkeypatch):
    import dapo_verl.config as config

    monkeypatch.setattr(config, "require_bool", lambda *args, **kwargs: None)  # as group_token_mean once was
    result = _run_target("DapoConfig.from_verl")
    assert result.failures, "accepted '' or 'false' for a boolean must not count as a correct result"
    assert any("accepted for a field of type bool" in f for f in result.failures)


def test_an_error_naming_another_argument_is_a_failure(monkeypatch):
    from dapo_verl import core

    real = core.dapo_loss

    def blames_old_logp(logp, *args, **kwargs):
        try:
            return real(logp, *args, **kwargs)
        except (ValueError, TypeError) as err:
            raise ValueError(f"old_logp is wrong ({type(err).__name__})") from None

    monkeypatch.setattr(core, "dapo_loss", blames_old_logp)
    result = _run_target("dapo_loss + clip_diagnostics")
    assert any("error names none of" in f for f in result.failures)


def test_the_loss_cases_inject_bad_token_counts_and_float32_overflow():
    result = _run_target("dapo_loss + clip_diagnostics", cases=600)
    assert result.drawn["bad:num_valid_tokens"] >= 10
    assert result.drawn["overflow"] >= 10
    assert result.failures == []


def test_the_local_backend_config_is_fuzzed_too():
    assert "LocalRunConfig (dapo-verl train's own keys)" in FUZZ_TARGETS
    result = _run_target("LocalRunConfig (dapo-verl train's own keys)")
    assert result.failures == [] and result.correct > 0 and result.clear_errors > 0


def test_the_group_cases_draw_complex_and_meta_rewards_and_each_is_refused_naming_rewards():
    import random

    from tools.reliability.fuzz_cases import Case, names_exactly
    from tools.reliability.fuzz_core import filter_case

    seen = set()
    for seed in range(600):
        case = Case(random.Random(seed))
        run = filter_case(case)
        kinds = {kind for kind in ("complex", "meta") if f"rewards made {kind}" in case.notes}
        if not kinds:
            continue
        seen |= kinds
        with pytest.raises((TypeError, ValueError)) as info:
            run()
        assert names_exactly(str(info.value), "rewards"), str(info.value)
    assert seen == {"complex", "meta"}


def test_the_overlong_cases_expect_float_lengths_to_be_refused():
    result = _run_target("reward_overlong_penalty + truncation masks", cases=400)
    assert result.drawn["bad:response_lengths"] >= 40
    assert result.failures == [] and result.correct > 0


def test_the_sampler_cases_draw_tensors_without_values_and_negative_counts():
    generate = _run_target("BatchReplenisher with faulty generate callbacks", cases=400)
    state = _run_target("BatchReplenisher.load_state_dict with damaged states", cases=300)
    assert generate.failures == [] and state.failures == []
    assert generate.drawn["bad:scores"] > 0 and state.drawn["bad:prompts_consumed"] + state.drawn["bad:all_wrong"] > 0
