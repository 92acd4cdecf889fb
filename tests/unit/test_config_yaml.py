"""configs/dapo_defaults.yaml is generated from dapo_verl/config.py and must not drift from it."""

from __future__ import annotations

from pathlib import Path

import yaml

from dapo_verl.config import DapoConfig, render_defaults_yaml

DEFAULTS = Path(__file__).resolve().parents[2] / "dapo_verl" / "configs" / "dapo_defaults.yaml"


def test_defaults_yaml_is_up_to_date():
    assert DEFAULTS.read_text() == render_defaults_yaml(), "run `dapo-verl config --write`"


def test_defaults_yaml_parses_back_to_the_default_config():
    assert DapoConfig.from_verl(yaml.safe_load(DEFAULTS.read_text())) == DapoConfig()


def test_every_key_has_a_comment_above_it_and_no_inline_comments():
    lines = DEFAULTS.read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.endswith(":"):
            continue
        assert "#" not in stripped, f"inline comment on line {i + 1}"
        assert lines[i - 1].strip().startswith("#"), f"key on line {i + 1} has no comment above it"
