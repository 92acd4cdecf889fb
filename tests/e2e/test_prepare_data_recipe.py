"""recipes/prepare_data.sh: reads DAPO_MATH_PARQUET, AIME_PARQUET and DATA_DIR, fails clearly, calls the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dapo_verl.data import check_verl_schema
from tests.data_prep_samples import write_aime_bytedtsinghua, write_dapo_math

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "recipes" / "prepare_data.sh"


def _run(env_vars: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in {"DAPO_MATH_PARQUET", "AIME_PARQUET", "DATA_DIR"}}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the venv's dapo-verl
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env={**env, **env_vars}, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, str]:
    return {
        "DAPO_MATH_PARQUET": str(write_dapo_math(tmp_path / "in" / "dapo-math-17k.parquet")),
        "AIME_PARQUET": str(write_aime_bytedtsinghua(tmp_path / "in" / "aime-2024.parquet")),
        "DATA_DIR": str(tmp_path / "out"),
    }


@pytest.mark.parametrize("missing", ["DAPO_MATH_PARQUET", "AIME_PARQUET", "DATA_DIR"])
def test_unset_variable_is_named(inputs, missing):
    result = _run({k: v for k, v in inputs.items() if k != missing})
    assert result.returncode == 2
    assert f"{missing} is not set; export {missing}=" in result.stderr


def test_nonexistent_input_path_is_named(inputs, tmp_path):
    result = _run({**inputs, "AIME_PARQUET": str(tmp_path / "nowhere.parquet")})
    assert result.returncode == 2
    assert "AIME_PARQUET=" in result.stderr and "does not exist" in result.stderr


def test_script_writes_verl_files_and_passes_extra_arguments(inputs):
    result = _run(inputs, "--dedup-key", "uuid", "--aime-repeat", "32")
    assert result.returncode == 0, result.stderr
    out = Path(inputs["DATA_DIR"])
    assert "kept 9 rows (dedup key uuid" in result.stdout
    assert check_verl_schema(out / "train.parquet") == 9
    assert check_verl_schema(out / "aime-2024.parquet") == 30
    assert check_verl_schema(out / "aime-2024-x32.parquet") == 960


def test_script_passes_shellcheck(shellcheck):
    result = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
