"""configs/dapo_defaults.yaml and docs/configuration.md's reference are generated from the dataclasses."""

from __future__ import annotations

from pathlib import Path

import yaml

from dapo_verl.config import DapoConfig, iter_verl_fields
from tools.config_docs import render_defaults_yaml, render_reference_markdown, update_generated_section

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ROOT / "dapo_verl" / "configs" / "dapo_defaults.yaml"


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


def test_docs_configuration_reference_is_up_to_date():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert update_generated_section(page, render_reference_markdown()) == page, "run `dapo-verl config --write`"


def test_reference_lists_every_dapo_key_once():
    table = render_reference_markdown()
    for key, _ in iter_verl_fields():
        assert table.count(f"| `{key}` |") == 1, key
