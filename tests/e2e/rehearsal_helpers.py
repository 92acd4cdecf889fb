"""Shared by the rehearsal tests: run ``dapo-verl rehearse`` and read what verl logged."""

from __future__ import annotations

import math
from pathlib import Path

from dapo_verl.rehearsal.report import PREDICTION_METRICS, REQUIRED_METRICS, read_jsonl
from dapo_verl.rehearsal.run import RehearsalOptions, rehearse
from dapo_verl.report.derived import RATIO_METRICS, RATIO_PARTS, derive_ratios

# The dapo_trainer config takes verl's defaults for sizes verl cannot guess; a user sets these too.
SIZES = [
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
]
# Surplus carried and prompts skipped by history: the sampler state a resume has to restore.
CARRY = [
    "algorithm.filter_groups.refill=barrier",
    "data.gen_batch_size=8",
    "algorithm.filter_groups.surplus=carry",
    "algorithm.filter_groups.skip_uninformative=true",
]
# Prompts chosen by prediction: the predictor's beliefs, calibration and noted predictions join the saved state.
PREDICTED = ["algorithm.filter_groups.prompt_selection=predicted"]


def run_rehearsal(
    tmp_path: Path,
    config: str,
    *overrides: str,
    steps: int = 3,
    resume: bool = True,
    gpus: int = 1,
    overlap: bool = False,
    engine: str | None = None,
):
    # Sequential, the default: the suite already keeps both cores busy, where overlapping the two runs only adds
    # contention and memory. engine=None: vLLM when it is installed.
    options = RehearsalOptions(
        config_name=config,
        overrides=tuple(overrides),
        out_dir=tmp_path / "rehearsal",
        steps=steps,
        resume=resume,
        gpus=gpus,
        timeout_s=600,
        overlap=overlap,
        engine=engine,
    )
    report = rehearse(options, echo=lambda line: None).report
    out = options.out_dir
    failures = [
        f"{r['name']} {r['state']}: {r['error'] or r.get('why', '')}"
        for r in report["runs"]
        if r["state"] != "finished"
    ]
    assert not failures, f"{failures}; logs under {out}"
    return report, read_jsonl(out / "run1" / "metrics.jsonl"), out


def training_steps(logged):
    return {step: data for step, data in logged.items() if "training/global_step" in data}


def assert_dapo_metrics_every_step(logged, steps, *, predicted=False):
    """Every DAPO metric in every training step verl logged; with ``predicted`` (a run with
    ``prompt_selection=predicted``), the predictor's calibration too."""
    trained = training_steps(logged)
    assert sorted(trained) == list(range(1, steps + 1))
    for step, data in trained.items():
        missing = [key for key in REQUIRED_METRICS if key not in data]
        assert not missing, f"step {step} lacks {missing}"
        assert (
            data["dapo/sampler/gen_rounds"] >= 1
            or data["dapo/sampler/groups_from_carry"] > 0
            or data["dapo/sampler/resumed_groups"] > 0
        )  # streaming: a step may only continue aborted groups
        assert 0 < data["dapo/sampler/pool_trained_fraction"] <= 1
        if predicted:  # the predictor's calibration in verl's own log: predicted against observed informative groups
            missing = [key for key in PREDICTION_METRICS if key not in data]
            assert not missing, f"step {step} lacks {missing}"
            if step > 1 and data["dapo/sampler/gen_rounds"] >= 1:  # step 1 has no prediction yet
                assert 0 < data["dapo/sampler/predicted_keep_rate"] <= 1
                assert data["dapo/sampler/prediction_brier"] >= 0
        assert 0 <= data["dapo/sampler/keep_rate"] <= 1
        assert data["timing_s/gen"] <= data["timing_s/step"]
        assert_clipped_probability_parts(data, f"step {step}")
    return trained


CLIPPED_PROBABILITY_PARTS = (
    *sorted(RATIO_PARTS),
    "actor/dapo/clip_upper_old_prob_max",
    "actor/dapo/clip_higher_kept_old_prob_max",
)


def assert_clipped_probability_parts(data, where):
    """The dapo loss's clipped-token probability parts, as verl aggregated them over its micro-batches."""
    missing = [key for key in CLIPPED_PROBABILITY_PARTS if key not in data]
    assert not missing, f"{where} lacks {missing}"
    for name in ("clip_upper", "clip_higher_kept"):
        tokens, total = data[f"actor/dapo/{name}_tokens"], data[f"actor/dapo/{name}_old_prob_sum"]
        # averaged alike over micro-batches, a sum of probabilities stays within its count
        assert 0 <= total <= tokens + 1e-9 and 0 <= data[f"actor/dapo/{name}_old_prob_max"] <= 1, (where, name)
    assert data["actor/dapo/clip_upper_tokens"] <= data["actor/dapo/positive_advantage_tokens"] + 1e-9, where
    ratios = derive_ratios(data)  # what dapo-verl compare reads from this log
    assert set(ratios) == set(RATIO_METRICS), where
    assert all(math.isnan(v) or 0 <= v <= 1 for v in ratios.values()), (where, ratios)
