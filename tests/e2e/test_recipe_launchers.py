"""recipes/run_single_node.sh and recipes/run_ray.sh: dry runs, the commands they start, clear path errors.

Nothing here starts training: dry runs only print, and the real launches run against stand-ins for the
interpreter and the ray CLI that record what they were given.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
SINGLE_NODE, RAY = RECIPES / "run_single_node.sh", RECIPES / "run_ray.sh"
PATH_VARIABLES = ("DAPO_MODEL_PATH", "DAPO_DATA_DIR", "DAPO_OUTPUT_DIR")
RECORDER = """#!/usr/bin/env python3
import json, os, sys
with open(os.environ["RECORD_FILE"], "w") as f:
    env = {k: v for k, v in os.environ.items() if k.startswith(("DAPO_", "VERL_"))}
    json.dump({"argv": sys.argv[1:], "env": env}, f)
"""


def _run(script: Path, env_vars: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAPO_", "VERL_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the venv's python3
    env["PYTHON"] = sys.executable
    return subprocess.run(
        ["bash", str(script), *args], env={**env, **env_vars}, capture_output=True, text=True, timeout=300
    )


def _sections(stdout: str) -> tuple[list[tuple[str, dict]], list[str]]:
    """The dry run's ("# Config: ..." header, parsed YAML) pairs and the command's words."""
    blocks = stdout.split("# Config: ")[1:]
    *configs, last = blocks
    last_config, command = last.split("# Command:\n")
    parsed = []
    for block in [*configs, last_config]:
        header, _, body = block.partition("\n")
        parsed.append((header, yaml.safe_load(body)))
    return parsed, shlex.split(command)


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "model").mkdir()
    (tmp_path / "data").mkdir()
    for name in ("train.parquet", "aime-2024.parquet"):
        (tmp_path / "data" / name).touch()
    return {
        "DAPO_MODEL_PATH": str(tmp_path / "model"),
        "DAPO_DATA_DIR": str(tmp_path / "data"),
        "DAPO_OUTPUT_DIR": str(tmp_path / "out"),
    }


def test_single_node_dry_run_prints_the_resolved_config_and_the_command(paths):
    result = _run(SINGLE_NODE, paths, "dapo_qwen2.5_math_1.5b", "--dry-run")
    assert result.returncode == 0, result.stderr
    [(header, config)], command = _sections(result.stdout)
    assert header == f"{sys.executable} -m dapo_verl.main --config-name dapo_qwen2.5_math_1.5b --cfg job --resolve"
    assert config["actor_rollout_ref"]["model"]["path"] == paths["DAPO_MODEL_PATH"]
    assert config["data"]["train_files"] == f"{paths['DAPO_DATA_DIR']}/train.parquet"
    out = paths["DAPO_OUTPUT_DIR"]
    assert config["trainer"]["default_local_dir"] == f"{out}/checkpoints/dapo-qwen2.5-math-1.5b/dapo-clip-0.2-0.28"
    assert command == [
        "env",
        *(f"{k}={paths[k]}" for k in PATH_VARIABLES),
        f"VERL_FILE_LOGGER_ROOT={out}/logs",
        "VERL_USE_EXTERNAL_MODULES=dapo_verl.adapter.register",
        sys.executable,
        "-m",
        "dapo_verl.main",
        "--config-name",
        "dapo_qwen2.5_math_1.5b",
    ]


def test_dry_run_of_a_multirun_shows_every_arm_and_names_missing_paths(paths):
    env = {k: v for k, v in paths.items() if k != "DAPO_MODEL_PATH"}
    result = _run(
        SINGLE_NODE, env, "dapo_clip_ablation", "--dry-run", "-m", "actor_rollout_ref.actor.clip_ratio_high=0.2,0.28"
    )
    assert result.returncode == 2
    assert "DAPO_MODEL_PATH is not set; export DAPO_MODEL_PATH=" in result.stderr
    configs, command = _sections(result.stdout)
    assert [config["actor_rollout_ref"]["actor"]["clip_ratio_high"] for _, config in configs] == [0.2, 0.28]
    for header, config in configs:
        assert not header.endswith("--resolve")  # printed as written, since a path variable is missing
        assert config["actor_rollout_ref"]["model"]["path"] == "${oc.env:DAPO_MODEL_PATH}"
    assert command[-4:] == [
        "--config-name",
        "dapo_clip_ablation",
        "-m",
        "actor_rollout_ref.actor.clip_ratio_high=0.2,0.28",
    ]


def test_dry_run_checks_the_config_as_the_run_will_and_names_each_problem(paths):
    result = _run(
        SINGLE_NODE,
        paths,
        "dapo_qwen2.5_math_1.5b",
        "--dry-run",
        "actor_rollout_ref.actor.policy_loss.loss_mode=dapoo",
        "actor_rollout_ref.actor.clip_ratio_hihg=0.3",
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    problems = [line for line in result.stderr.splitlines() if line.startswith("python -m dapo_verl.main: ")]
    assert len(problems) == 2
    assert any("did you mean actor_rollout_ref.actor.clip_ratio_high?" in line for line in problems)
    assert any(
        "loss_mode='dapoo' is not registered in verl" in line and "Did you mean dapo?" in line for line in problems
    )
    assert "would be refused at start-up; the lines above say why." in result.stderr
    assert "# Command:" in result.stdout  # the command is still shown


def test_ray_dry_run_prints_the_job_submission(paths):
    result = _run(RAY, paths, "dapo_qwen2.5_32b", "--dry-run")
    assert result.returncode == 0, result.stderr
    [(_, config)], command = _sections(result.stdout)
    assert config["trainer"]["nnodes"] == 16
    assert config["actor_rollout_ref"]["model"]["path"] == paths["DAPO_MODEL_PATH"]
    assert command[:5] == ["ray", "job", "submit", "--no-wait", "--submission-id"]
    assert command[5].startswith("dapo-dapo_qwen2.5_32b-")
    assert command[8:] == ["--", "python3", "-m", "dapo_verl.main", "--config-name", "dapo_qwen2.5_32b"]
    assert command[6] == "--runtime-env-json"
    env_vars = json.loads(command[7])["env_vars"]
    assert env_vars == {
        **paths,
        "VERL_FILE_LOGGER_ROOT": f"{paths['DAPO_OUTPUT_DIR']}/logs",
        "VERL_USE_EXTERNAL_MODULES": "dapo_verl.adapter.register",
    }


def test_ray_dry_run_with_follow_waits_and_sends_the_named_variables_and_this_shells_plugin_modules(paths):
    env = {
        **paths,
        "DAPO_SUBMISSION_ID": "my-run-1",
        "DAPO_JOB_ENV": "WANDB_API_KEY, HF_TOKEN",
        "WANDB_API_KEY": "k3y",
        "HF_TOKEN": "",
        "VERL_USE_EXTERNAL_MODULES": "email.utils,dapo_verl.adapter.register",
    }
    result = _run(RAY, env, "dapo_qwen2.5_32b", "--follow", "--dry-run")
    assert result.returncode == 0, result.stderr
    _, command = _sections(result.stdout)
    assert command[:5] == ["ray", "job", "submit", "--submission-id", "my-run-1"]  # no --no-wait
    env_vars = json.loads(command[6])["env_vars"]
    assert env_vars["WANDB_API_KEY"] == "k3y" and env_vars["HF_TOKEN"] == ""
    assert env_vars["VERL_USE_EXTERNAL_MODULES"] == "dapo_verl.adapter.register,email.utils"


@pytest.mark.parametrize(
    ("names", "said"),
    [
        ("WANDB_API_KEY", "DAPO_JOB_ENV names WANDB_API_KEY, which is not set in this shell; export it or drop it"),
        ("NOT-A-NAME", "DAPO_JOB_ENV names 'NOT-A-NAME', which is not a variable name; list names like WANDB_API_KEY."),
    ],
)
def test_ray_launch_refuses_a_job_variable_it_cannot_send(paths, names, said):
    result = _run(RAY, {**paths, "DAPO_JOB_ENV": names}, "dapo_qwen2.5_32b")
    assert result.returncode == 2 and said in result.stderr


def test_follow_belongs_to_the_ray_launcher(paths):
    result = _run(SINGLE_NODE, paths, "dapo_qwen2.5_math_1.5b", "--follow")
    assert result.returncode == 2
    assert "--follow is run_ray.sh's (it waits for a submitted Ray job); run_single_node.sh already runs" in (
        result.stderr
    )


@pytest.mark.parametrize(
    ("script", "missing"),
    [
        (SINGLE_NODE, "DAPO_MODEL_PATH"),
        (SINGLE_NODE, "DAPO_DATA_DIR"),
        (RAY, "DAPO_MODEL_PATH"),
        (RAY, "DAPO_DATA_DIR"),
        (RAY, "DAPO_OUTPUT_DIR"),
    ],
)
def test_launch_without_a_path_variable_stops_naming_it(paths, script, missing):
    result = _run(script, {k: v for k, v in paths.items() if k != missing}, "dapo_qwen2.5_math_1.5b")
    assert result.returncode == 2 and result.stdout == ""
    assert f"{missing} is not set; export {missing}=" in result.stderr


def test_single_node_launch_names_paths_that_do_not_exist(paths, tmp_path):
    result = _run(SINGLE_NODE, {**paths, "DAPO_DATA_DIR": str(tmp_path / "nowhere")}, "dapo_qwen2.5_math_1.5b")
    assert result.returncode == 2
    assert f"{tmp_path}/nowhere/train.parquet does not exist; run recipes/prepare_data.sh" in result.stderr


def test_ray_launch_refuses_a_relative_output_dir(paths):
    result = _run(RAY, {**paths, "DAPO_OUTPUT_DIR": "runs"}, "dapo_qwen2.5_32b")
    assert result.returncode == 2 and "DAPO_OUTPUT_DIR=runs is relative" in result.stderr


def test_launchers_need_a_config_name(paths):
    for script in (SINGLE_NODE, RAY):
        result = _run(script, paths, "--dry-run")
        assert result.returncode == 2 and "no config named. Usage:" in result.stderr


def _recorder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    tool = folder / name
    tool.write_text(RECORDER.replace("#!/usr/bin/env python3", f"#!{sys.executable}"))
    tool.chmod(0o755)
    return tool


def test_single_node_launch_runs_the_trainer_with_the_paths(paths, tmp_path):
    record = tmp_path / "record.json"
    python = _recorder(tmp_path, "python3")
    result = _run(
        SINGLE_NODE,
        {**paths, "PYTHON": str(python), "RECORD_FILE": str(record)},
        "dapo_clip_ablation",
        "-m",
        "actor_rollout_ref.actor.clip_ratio_high=0.2,0.28",
    )
    assert result.returncode == 0, result.stderr
    ran = json.loads(record.read_text())
    assert ran["argv"] == [
        "-m",
        "dapo_verl.main",
        "--config-name",
        "dapo_clip_ablation",
        "-m",
        "actor_rollout_ref.actor.clip_ratio_high=0.2,0.28",
    ]
    assert ran["env"] == {
        **paths,
        "VERL_FILE_LOGGER_ROOT": f"{paths['DAPO_OUTPUT_DIR']}/logs",
        "VERL_USE_EXTERNAL_MODULES": "dapo_verl.adapter.register",
    }


def test_ray_launch_submits_the_job(paths, tmp_path):
    record = tmp_path / "record.json"
    ray = _recorder(tmp_path, "ray")
    env = {**paths, "RECORD_FILE": str(record), "PATH": f"{ray.parent}{os.pathsep}{os.environ['PATH']}"}
    result = _run(RAY, env, "dapo_wo_ds_qwen2.5_32b")
    assert result.returncode == 0, result.stderr
    argv = json.loads(record.read_text())["argv"]
    assert argv[:4] == ["job", "submit", "--no-wait", "--submission-id"]
    assert argv[5] == "--runtime-env-json"
    assert json.loads(argv[6])["env_vars"]["DAPO_MODEL_PATH"] == paths["DAPO_MODEL_PATH"]
    assert argv[7:] == ["--", "python3", "-m", "dapo_verl.main", "--config-name", "dapo_wo_ds_qwen2.5_32b"]


@pytest.mark.parametrize("script", ["run_single_node.sh", "run_ray.sh", "_launch.sh"])
def test_launcher_passes_shellcheck(script, shellcheck):
    result = subprocess.run(
        [shellcheck, "-x", str(RECIPES / script)], capture_output=True, text=True, cwd=RECIPES.parent
    )
    assert result.returncode == 0, result.stdout


def test_a_followed_job_is_stopped_when_the_launcher_is_terminated(tmp_path):
    # A stand-in for the ray command line that records what it was asked (the real `ray job submit` tails a real
    # job above); `job submit` follows a job that never ends.
    fake = tmp_path / "bin" / "ray"
    fake.parent.mkdir()
    fake.write_text(
        f"#!{sys.executable}\nimport sys, time\nopen({str(tmp_path / 'calls')!r}, 'a').write("
        f"' '.join(sys.argv[1:4]) + '\\n')\nif sys.argv[1:3] == ['job', 'submit']:\n    time.sleep(120)\n"
    )
    fake.chmod(0o755)
    env = {
        **os.environ,
        "DAPO_MODEL_PATH": "/m",
        "DAPO_DATA_DIR": "/d",
        "DAPO_OUTPUT_DIR": "/o",
        "DAPO_SUBMISSION_ID": "long-1",
        "PYTHON": sys.executable,
        "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
    }
    launcher = subprocess.Popen(
        ["bash", str(RAY), "dapo_qwen2.5_32b", "--follow"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "calls").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 143
    assert "run_ray.sh: SIGTERM: stopping job long-1 (ray job stop)" in stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["job submit --submission-id", "job stop --no-wait"]
