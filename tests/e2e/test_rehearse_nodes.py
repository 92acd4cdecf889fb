"""``dapo-verl rehearse --nodes 2``: the paper recipe submitted by recipes/run_ray.sh to a two-node Ray cluster on
this machine, verl's workers on both nodes; a broken job reaching the user through ``run_ray.sh --follow``; nothing
left afterwards.

Everything here is real: Ray's own ``ray start`` nodes and job server, ``ray job submit``, verl's trainer and
workers, verl's own vLLM rollout on vLLM's CPU build (the stand-in engine where it is not installed, as the report
says).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dapo_verl.rehearsal import reaper
from dapo_verl.rehearsal.bridges import cpu_leftovers
from dapo_verl.rehearsal.cluster import LocalCluster
from dapo_verl.rehearsal.multinode import RUN_RAY, node_env
from dapo_verl.rehearsal.report import read_jsonl
from tests.e2e.rehearsal_helpers import assert_dapo_metrics_every_step

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLI = Path(sys.executable).parent / "dapo-verl"


def _nothing_left(*markers: str) -> None:
    deadline = time.monotonic() + 45
    while (left := [p for m in markers for p in reaper.processes_naming(m)]) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, left


def test_the_paper_recipe_runs_as_a_job_on_two_nodes_with_verls_workers_on_both(tmp_path, memory_heavy):
    # --no-resume: a resume is verl's checkpoint load and the sampler's state, which the one-node rehearsals check
    # exactly (test_rehearse_vllm.py, test_rehearse_v1.py); here a second job would repeat the first's path, and
    # its start-up cost a third of this test's CPU.
    out = tmp_path / "rehearsal"
    done = subprocess.run(
        [str(CLI), "rehearse", "dapo_qwen2.5_32b", "--nodes", "2", "--no-resume", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    said = (done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0 and (out / "report.json").is_file(), said  # a rehearsal that cannot start has none
    report = json.loads((out / "report.json").read_text())
    assert report["ok"], said
    cluster = report["cluster"]
    assert cluster["ok"] and cluster["spans_nodes"] and cluster["job_env_on_every_node"]
    assert list(cluster["jobs"]) == ["run1"] and "resume" not in report
    job = cluster["jobs"]["run1"]
    assert job["status"] == "SUCCEEDED" and Path(job["log"]).read_text()  # what `ray job logs` prints
    nodes = {node["node"]: node for node in job["nodes"]}
    assert set(nodes) == {"head", "worker-1"} and nodes["head"]["head"] and not nodes["worker-1"]["head"]
    for node in nodes.values():  # read from Ray's state API: one FSDP worker and one vLLM server on each node
        assert "actor" in node["roles"] and "rollout" in node["roles"], node
        assert node["job_env"] and node["entry_point"], node  # seen from inside its processes
    # The job wrote where run_ray.sh documents it: $DAPO_OUTPUT_DIR/logs/<project>/<experiment>.jsonl, and the
    # recipe's checkpoint folder under $DAPO_OUTPUT_DIR.
    project, experiment = "dapo-qwen2.5-32b", "dapo-clip-0.2-0.28"
    logged = read_jsonl(out / "run1" / "output" / "logs" / project / f"{experiment}.jsonl")
    assert_dapo_metrics_every_step(logged, 3)
    assert (out / "run1" / "output" / "checkpoints" / project / experiment / "global_step_2").is_dir()
    assert [(run["name"], run["state"]) for run in report["runs"]] == [("run1", "finished")]
    changes = {c["key"]: c for c in json.loads((out / "changes.json").read_text())}
    # Only what a CPU cannot do changed, and the engine's budgets keep their relations (one factor, 22528 -> 136).
    assert changes["actor_rollout_ref.rollout.dtype"]["rehearsal"] == "float32"
    assert changes["actor_rollout_ref.rollout.free_cache_engine"]["rehearsal"] is False
    assert changes["actor_rollout_ref.rollout.max_num_batched_tokens"]["rehearsal"] == 136
    assert changes["actor_rollout_ref.rollout.tensor_model_parallel_size"]["rehearsal"] == 1
    assert "actor_rollout_ref.rollout.top_p" not in changes and "actor_rollout_ref.rollout.temperature" not in changes
    assert report["rollout_vs_actor"]["ok"] and report["engine_started"]
    assert "cluster: 2 Ray nodes on this machine" in done.stdout
    _nothing_left(str(out), cluster["temp_dir"])
    records = out / "run1" / "engine"  # the shared memory the run's processes recorded is gone
    assert not [n for n in cpu_leftovers.recorded_names(records) if (cpu_leftovers.SHM_ROOT / n).exists()]
    assert report["leftovers_removed"]["run1"]["bytes"] > 100 * 2**20  # vLLM's message queues, two engines


def test_a_broken_job_fails_the_followed_launcher_with_the_jobs_own_error(tmp_path):
    temp = tempfile.mkdtemp(prefix="dvr-")
    cluster = LocalCluster(2, 1, temp, tmp_path / "cluster", node_env({}), echo=lambda line: None)
    try:
        with cluster:
            env = {
                **os.environ,
                "RAY_ADDRESS": cluster.dashboard_url,
                "DAPO_MODEL_PATH": str(tmp_path / "model"),
                "DAPO_DATA_DIR": str(tmp_path / "data"),
                "DAPO_OUTPUT_DIR": str(tmp_path / "output"),
                "PYTHON": sys.executable,
                "DAPO_SUBMISSION_ID": "broken-1",
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            }
            done = subprocess.run(
                ["bash", str(RUN_RAY), "dapo_qwen2.5_32b", "--follow", "actor_rollout_ref.actor.clip_ratio_hihg=0.3"],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 1, done.stdout[-2000:]
            # The job's own error, streamed from the cluster, then the launcher's verdict.
            assert "clip_ratio_hihg" in done.stdout and "clip_ratio_high" in done.stdout, done.stdout[-2000:]
            assert "run_ray.sh: job broken-1 ended FAILED; its log: ray job logs broken-1" in done.stderr
    finally:
        cluster.stop()
    _nothing_left(temp)
    shutil.rmtree(temp)  # the cluster's Ray folder, which this test made (a rehearsal removes its own)
