"""The pieces of a multi-node rehearsal that need no cluster: the nodes' commands and environment, where each job's
output lands, and how the report reads what the cluster and the run's processes said.

The cluster itself, verl's jobs on it and the launcher's failure path run in tests/e2e/test_rehearse_nodes.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dapo_verl.rehearsal.bridges import cpu_vllm, process_record, resume_barrier
from dapo_verl.rehearsal.cluster import LocalCluster, free_ports, role_of
from dapo_verl.rehearsal.multinode import _seen_on_nodes, cluster_lines, job_target, node_env
from dapo_verl.rehearsal.processes import PLUGIN_MODULE
from dapo_verl.rehearsal.run import compose_recipe


def test_each_node_gets_its_own_ports_and_the_head_the_job_server(tmp_path):
    cluster = LocalCluster(3, 2, "/tmp/dvr-x", tmp_path, {})
    head, *workers = (cluster._command(i) for i in range(3))
    assert "--head" in head and "--include-dashboard=true" in head and f"--dashboard-port={cluster.dashboard_url[-5:]}"
    assert all(f"--address={cluster.gcs_address}" in command and "--head" not in command for command in workers)
    agents = [
        next(a for a in command if a.startswith("--dashboard-agent-listen-port=")) for command in (head, *workers)
    ]
    assert len(set(agents)) == 3  # Ray's default (52365) would clash between nodes of one machine
    assert all("--num-gpus=2" in c and "--temp-dir=/tmp/dvr-x" in c and "--block" in c for c in (head, *workers))
    assert [cluster.node_name(i) for i in range(3)] == ["head", "worker-1", "worker-2"]
    with pytest.raises(ValueError, match="nodes=1: a multi-node cluster has >= 2 nodes"):
        LocalCluster(1, 1, "/tmp/dvr-x", tmp_path, {})


def test_free_ports_are_distinct_and_roles_name_verls_actors():
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(1024 < port < 65536 for port in ports)
    classes = (
        "create_colocated_worker_cls.<locals>.WorkerDict",
        "vLLMHttpServer",
        "CpuRolloutServer",
        "RewardLoopWorker",
        "TaskRunnerV1",
        "SimpleStorageUnit",
        "pkg.Other",
    )
    assert [role_of(c) for c in classes] == [
        "actor",
        "rollout",
        "rollout",
        "reward",
        "trainer",
        "transfer queue",
        "Other",
    ]


def test_the_nodes_environment_holds_the_machine_and_nothing_a_job_brings(monkeypatch):
    monkeypatch.setenv("DAPO_OUTPUT_DIR", "/somewhere")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    env = node_env({"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert env["VERL_PLATFORM"] == "cpu" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    for name in (
        "DAPO_OUTPUT_DIR",
        "VERL_FILE_LOGGER_PATH",
        "VERL_USE_EXTERNAL_MODULES",
        cpu_vllm.RECORD_ENV,
        "CUDA_VISIBLE_DEVICES",
        "RAY_ADDRESS",
    ):
        assert name not in env, name
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)  # the job's python3 is this one


def test_a_job_writes_where_the_launcher_documents_it_and_sends_the_runs_folders(tmp_path, monkeypatch):
    monkeypatch.delenv("DAPO_OUTPUT_DIR", raising=False)
    config, _ = compose_recipe("dapo_qwen2.5_32b", [])
    cluster = SimpleNamespace(dashboard_url="http://127.0.0.1:1234")
    target = job_target(config, "dapo_qwen2.5_32b", tmp_path, cluster, "/m", tmp_path / "data", True)
    assert target.command[0] == "bash" and target.command[1].endswith("recipes/run_ray.sh")
    assert target.command[2:] == ["dapo_qwen2.5_32b", "--follow"] and not target.sets_checkpoint_dir
    run = "dapo-qwen2.5-32b/dapo-clip-0.2-0.28"
    assert target.metrics("run1") == tmp_path / "run1" / "output" / "logs" / f"{run}.jsonl"
    assert target.checkpoints("run2") == tmp_path / "run2" / "output" / "checkpoints" / run
    assert "DAPO_OUTPUT_DIR" not in os.environ  # set only while the recipe's folder was resolved
    first, second = target.env("run1", "/tmp/dvr-a"), target.env("run2", "/tmp/dvr-b")
    assert first["RAY_ADDRESS"] == "http://127.0.0.1:1234" and first["DAPO_OUTPUT_DIR"] == str(
        tmp_path / "run1" / "output"
    )
    assert first["DAPO_JOB_ENV"].split() == [cpu_vllm.RECORD_ENV, cpu_vllm.SOCKET_ENV]
    assert second["DAPO_JOB_ENV"].split()[2:] == [resume_barrier.ENV, resume_barrier.TIMEOUT_ENV]
    assert (
        first["VERL_USE_EXTERNAL_MODULES"] == PLUGIN_MODULE
        and first["DAPO_SUBMISSION_ID"] != second["DAPO_SUBMISSION_ID"]
    )
    own = job_target(config, "dapo_qwen2.5_32b", tmp_path, cluster, "/m", tmp_path / "data", False)
    assert own.sets_checkpoint_dir and own.checkpoints("run1") == tmp_path / "run1" / "checkpoints"


def _record(node: str, output: str, loads: bool = True, **env: str | None) -> dict:
    values = {name: "x" for name in process_record.JOB_VARIABLES} | {"DAPO_OUTPUT_DIR": output} | env
    return {"pid": 1, "node_id": node, "env": values, "entry_point": {"loads": loads}}


def test_a_node_counts_as_reached_only_when_a_process_there_saw_the_jobs_variables_and_the_entry_point():
    nodes = [{"node_id": "h"}, {"node_id": "w"}, {"node_id": "v"}]
    records = [
        _record("h", "/out/run1/output"),
        _record("w", "/out/run1/output", VERL_FILE_LOGGER_ROOT=None),
        _record("w", "/elsewhere"),
        _record("v", "/out/run1/output", loads=False),
    ]
    _seen_on_nodes(nodes, records, "/out/run1/output")
    assert [(n["job_env"], n["entry_point"], n["processes_recorded"]) for n in nodes] == [
        (True, True, 1),
        (False, True, 2),
        (True, False, 1),
    ]


def test_the_cluster_lines_say_where_each_role_ran_and_what_failed():
    node = {"node": "head", "roles": ["trainer", "actor"], "job_env": True, "entry_point": True}
    worker = {"node": "worker-1", "roles": ["actor", "rollout"], "job_env": False, "entry_point": True}
    cluster = {
        "nodes": 2,
        "gpus_per_node": 1,
        "launcher": "/r/recipes/run_ray.sh",
        "spans_nodes": True,
        "job_env_on_every_node": False,
        "ok": False,
        "jobs": {"run1": {"submission_id": "s1", "status": "SUCCEEDED", "nodes": [node, worker]}},
    }
    lines = cluster_lines(cluster)
    assert lines[0] == (
        "cluster: 2 Ray nodes on this machine, 1 fake GPU(s) each; each run submitted by run_ray.sh --follow"
    )
    assert lines[1] == (
        "  run1: job s1 SUCCEEDED; head ran trainer, actor; worker-1 ran actor, rollout; job's "
        "variables and plugin entry point seen by its processes on: head yes, worker-1 NO"
    )
    assert lines[2] == ("  cluster check: FAILED: a node's processes missed the job's variables or the entry point")


def test_a_process_records_the_jobs_variables_and_finds_verls_plugin_entry_point_of_dapo_verl(tmp_path, monkeypatch):
    monkeypatch.setenv("DAPO_OUTPUT_DIR", "/out/run1/output")
    monkeypatch.delenv("DAPO_DATA_DIR", raising=False)
    process_record.record_process(tmp_path)
    (tmp_path / "processes" / "99.json").write_text('{"pid": 99, "node')  # killed while writing: skipped
    [record] = process_record.read_records(tmp_path)
    assert record["pid"] == os.getpid() and record["node_id"] is None  # no Ray here
    assert record["env"]["DAPO_OUTPUT_DIR"] == "/out/run1/output" and record["env"]["DAPO_DATA_DIR"] is None
    assert record["entry_point"]["found"] == ["dapo = dapo_verl.adapter.register"]  # pyproject's verl.plugins
    assert record["entry_point"]["loads"] is True


def test_a_node_whose_ray_start_fails_at_every_start_is_reported_with_its_log(tmp_path, monkeypatch):
    from dapo_verl.rehearsal.cluster import ClusterError

    said = []
    cluster = LocalCluster(2, 1, "/tmp/dvr-none", tmp_path, {}, echo=said.append)
    monkeypatch.setattr(cluster, "_command", lambda index: [sys.executable, "-c", "print('port taken'); exit(3)"])
    monkeypatch.setattr(cluster, "_alive_nodes", lambda: 0)
    with (
        pytest.raises(
            ClusterError, match=r"Ray node head exited with status 3 \(.*head.log: port taken\) at each of 3 starts"
        ),
        cluster,
    ):
        pass
    assert len(said) == 2 and all("starting the cluster again on fresh ports" in line for line in said), said


def test_a_node_that_exits_at_start_is_started_again_on_fresh_ports(tmp_path, monkeypatch):
    # The first head exits as a node does whose chosen port another program took; the second start comes up.
    said, commands = [], []
    cluster = LocalCluster(2, 1, "/tmp/dvr-none", tmp_path, {}, echo=said.append)
    first_gcs = cluster.gcs_address

    def command(index):
        commands.append((index, cluster.gcs_address))
        if len(commands) == 1:
            return [sys.executable, "-c", "print('bind: address already in use'); exit(1)"]
        return [sys.executable, "-c", "import time; time.sleep(60)"]

    monkeypatch.setattr(cluster, "_command", command)

    def alive():  # as Ray counts them: a node that exits never joined
        return sum(p.poll() is None and "sleep" in str(p.args) for p in cluster._processes)

    monkeypatch.setattr(cluster, "_alive_nodes", alive)
    monkeypatch.setattr(cluster, "_job_server_answers", lambda: True)
    try:
        cluster.start()
        assert [index for index, _ in commands] == [0, 0, 1]
        assert commands[1][1] == cluster.gcs_address != first_gcs  # the second start chose its ports again
        assert "head exited with status 1" in said[0] and "address already in use" in said[0], said
        assert "starting the cluster again on fresh ports" in said[0] and "2 Ray nodes up" in said[1], said
        assert all(p.poll() is None for p in cluster._processes) and len(cluster._processes) == 2
    finally:
        cluster.stop()
