"""`dapo-verl toy`: the paper's exercises produce the documented results."""

from __future__ import annotations

import json

import pytest

from dapo_verl.cli import main


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy")
    assert main(["toy", "--out", str(out)]) == 0
    assert (out / "toy.png").stat().st_size > 10_000
    return json.loads((out / "toy.json").read_text())


def test_only_the_mixed_group_survives_in_both_encodings(report):
    for encoding in ("0/1", "-1/1"):
        kept = [name for name, group in report["filter"][encoding].items() if group["kept"]]
        assert kept == ["mixed"]


def test_ratio_1_25_with_positive_advantage_has_gradient_only_under_clip_higher(report):
    probe = report["clip_sweep"]["gradient_at_ratio_1.25_positive_advantage"]
    assert probe["clip-higher 0.2/0.28"] == pytest.approx(1.0)
    assert probe["symmetric 0.2/0.2"] == 0.0


def test_sweep_covers_both_signs_and_settings(report):
    curves = report["clip_sweep"]["curves"]
    assert len(curves) == 4
    for curve in curves.values():
        assert curve["ratio"][0] == pytest.approx(0.5) and curve["ratio"][-1] == pytest.approx(1.5)
        assert len(curve["objective"]) == len(curve["gradient"]) == len(curve["ratio"])
    negative = curves["clip-higher 0.2/0.28, A=-1"]
    below = [g for r, g in zip(negative["ratio"], negative["gradient"]) if r < 0.79]
    assert all(g == 0.0 for g in below)  # A < 0 clipped below 1 - eps_low


def test_unequal_lengths_weigh_tokens_not_responses(report):
    weights = report["token_weights"]
    assert weights["response_lengths"] == [2, 8]
    assert weights["token-level (DAPO)"]["share_of_gradient_per_response"] == pytest.approx([0.2, 0.8])
    assert weights["sample-level (GRPO)"]["share_of_gradient_per_response"] == pytest.approx([0.5, 0.5])
    token_weights = weights["token-level (DAPO)"]["weight_per_token"]
    assert token_weights[0] == pytest.approx(token_weights[1])


def test_cli_prints_where_the_output_went(tmp_path, capsys):
    main(["toy", "--out", str(tmp_path / "out")])
    assert f"Wrote {tmp_path / 'out' / 'toy.json'}" in capsys.readouterr().out
