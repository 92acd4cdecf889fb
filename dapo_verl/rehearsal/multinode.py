"""``dapo-verl rehearse --nodes N``: each run is a Ray job that ``recipes/run_ray.sh --follow`` submits to a
multi-node cluster on this machine (:mod:`.cluster`).

What differs from a one-node rehearsal is only how a run starts and where its output lands, as on a cluster:

* the run's command is the cluster launcher itself, ``bash recipes/run_ray.sh CONFIG --follow`` with the
  rehearsal's overrides, given ``RAY_ADDRESS`` (the cluster's job server), ``DAPO_MODEL_PATH``, ``DAPO_DATA_DIR``
  and an absolute ``DAPO_OUTPUT_DIR`` of the run's own (``runN/output``); the launcher sends them with the job, with
  the rehearsal's CPU plugin (listed in ``VERL_USE_EXTERNAL_MODULES``) and the run's record and socket folders
  (named in ``DAPO_JOB_ENV``);
* verl's JSONL is where the launcher documents it, ``$DAPO_OUTPUT_DIR/logs/<project_name>/<experiment_name>.jsonl``,
  and its checkpoints are the recipe's own folder under ``DAPO_OUTPUT_DIR`` (or ``runN/checkpoints`` for a recipe
  whose folder is not under it);
* the nodes' environment holds what makes this machine's processes look like GPU nodes to verl (the CPU platform,
  vLLM's CPU settings and the bridges' folder), and nothing a job brings.

After the runs, :func:`job_report` reads from the cluster which node ran each actor of each job, the job's status
and its logs (``runN/job.log``, as ``ray job logs`` prints them), and from the run's process records what the
processes on each node saw (:mod:`.bridges.process_record`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from dapo_verl.rehearsal.bridges import cpu_vllm, process_record, resume_barrier
from dapo_verl.rehearsal.changes import select
from dapo_verl.rehearsal.cluster import LocalCluster
from dapo_verl.rehearsal.folders import RehearsalError
from dapo_verl.rehearsal.processes import PLUGIN_MODULE, environment
from dapo_verl.rehearsal.schedule import Target

__all__ = ["RUN_RAY", "cluster_lines", "job_report", "job_target", "node_env", "submission_id"]

RUN_RAY = Path(__file__).resolve().parents[2] / "recipes" / "run_ray.sh"
"""The cluster launcher, in the repository beside the package."""

_JOB_LEVEL = (
    "VERL_FILE_LOGGER_PATH",
    "VERL_FILE_LOGGER_ROOT",
    "VERL_USE_EXTERNAL_MODULES",
    cpu_vllm.RECORD_ENV,
    cpu_vllm.SOCKET_ENV,
    "DAPO_MODEL_PATH",
    "DAPO_DATA_DIR",
    "DAPO_OUTPUT_DIR",
    "RAY_ADDRESS",
)


def launcher() -> Path:
    """``recipes/run_ray.sh``, or a :class:`RehearsalError` saying where it was looked for."""
    if not RUN_RAY.is_file():
        raise RehearsalError(
            f"--nodes rehearses through recipes/run_ray.sh, which is not at {RUN_RAY}: install "
            f"dapo_verl from its repository (pip install -e .) to rehearse on several nodes."
        )
    return RUN_RAY


def _path() -> str:
    """``PATH`` with this interpreter's folder first: a job's ``python3`` and ``ray`` are this environment's."""
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])


def node_env(engine_env: dict[str, str]) -> dict[str, str]:
    """The nodes' environment: a run's (:func:`.processes.environment`, with the engine's) without what a job
    brings (see the module docstring), with this environment's ``python3`` first on ``PATH``."""
    env = environment(Path(os.devnull), engine_env)
    return {name: value for name, value in env.items() if name not in _JOB_LEVEL} | {"PATH": _path()}


def submission_id(run: str) -> str:
    """The Ray job submission id of ``run`` (``run1``, ``run2``) on the rehearsal's own cluster."""
    return f"dapo-rehearsal-{run}"


@contextlib.contextmanager
def _output_dir_set(folder: Path) -> Iterator[None]:
    before = os.environ.get("DAPO_OUTPUT_DIR")
    os.environ["DAPO_OUTPUT_DIR"] = str(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DAPO_OUTPUT_DIR", None)
        else:
            os.environ["DAPO_OUTPUT_DIR"] = before


def job_target(
    config: DictConfig,
    config_name: str,
    out: Path,
    cluster: LocalCluster,
    model_path: str,
    data_dir: Path,
    recipe_checkpoints: bool,
) -> Target:
    """How each run reaches the cluster (see the module docstring).

    Args:
        config: The recipe as composed (its project, experiment and checkpoint folder name the paths).
        config_name: The recipe's name, for the launcher.
        out: The rehearsal's folder.
        cluster: The running cluster.
        model_path: The model the runs load (``DAPO_MODEL_PATH``).
        data_dir: The rehearsal's data folder (``DAPO_DATA_DIR``).
        recipe_checkpoints: Whether the recipe's checkpoint folder lies under ``DAPO_OUTPUT_DIR``.
    """
    project, experiment = select(config, "trainer.project_name"), select(config, "trainer.experiment_name")

    def output(run: str) -> Path:
        return out / run / "output"

    def checkpoints(run: str) -> Path:
        if not recipe_checkpoints:
            return out / run / "checkpoints"
        with _output_dir_set(output(run)):
            return Path(str(select(config, "trainer.default_local_dir")))

    def env(run: str, ray_dir: str) -> dict[str, str]:
        sent = [cpu_vllm.RECORD_ENV, cpu_vllm.SOCKET_ENV]
        if run == "run2":
            sent += [resume_barrier.ENV, resume_barrier.TIMEOUT_ENV]
        return {
            "RAY_ADDRESS": cluster.dashboard_url,
            "DAPO_MODEL_PATH": model_path,
            "DAPO_DATA_DIR": str(data_dir),
            "DAPO_OUTPUT_DIR": str(output(run)),
            "DAPO_SUBMISSION_ID": submission_id(run),
            "DAPO_JOB_ENV": " ".join(sent),
            "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE,
            "PYTHON": sys.executable,
            "PATH": _path(),
        }

    return Target(
        ["bash", str(launcher()), config_name, "--follow"],
        checkpoints,
        env,
        metrics=lambda run: output(run) / "logs" / str(project) / f"{experiment}.jsonl",
        sets_checkpoint_dir=not recipe_checkpoints,
    )


def _ray_version() -> str:
    import ray

    return str(ray.__version__)


def _seen_on_nodes(nodes: list[dict[str, Any]], records: list[dict[str, Any]], output_dir: str) -> None:
    """Add to each node what its processes saw: ``job_env`` (a process there had the run's ``DAPO_OUTPUT_DIR`` and
    every variable the launcher sends) and ``entry_point`` (verl's plugin entry point of dapo_verl loaded there)."""
    for node in nodes:
        here = [r for r in records if r.get("node_id") == node["node_id"]]
        node["processes_recorded"] = len(here)
        node["job_env"] = any(
            r["env"].get("DAPO_OUTPUT_DIR") == output_dir
            and all(r["env"].get(name) for name in process_record.JOB_VARIABLES)
            for r in here
        )
        node["entry_point"] = any(r["entry_point"]["loads"] for r in here)


def job_report(cluster: LocalCluster, out: Path, runs: list[str]) -> dict[str, Any]:
    """What the cluster says of each run's job, for ``report.json``'s ``cluster`` section.

    For each run: the job's submission id, Ray job id and final status, its log (saved to ``runN/job.log``), the
    actors of the job on each node with their roles, and what the run's processes on each node saw
    (:func:`_seen_on_nodes`). ``ok`` holds when every job succeeded, verl's workers (role ``actor``) ran on every
    node in every job, and on every node the job's variables and the plugin's entry point reached its processes.
    """
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    jobs = {}
    for run in runs:
        sid = submission_id(run)
        entry: dict[str, Any] = {"submission_id": sid, "job_id": cluster.job_id(sid), "status": None, "log": None}
        with contextlib.suppress(Exception):  # a job that was never submitted
            entry["status"] = client.get_job_status(sid).value
            (out / run / "job.log").write_text(client.get_job_logs(sid))
            entry["log"] = str(out / run / "job.log")
        entry["nodes"] = [
            {
                "node": n.node,
                "node_id": n.node_id,
                "head": n.head,
                "roles": n.roles,
                "actors": [{"role": r, "class": c, "pid": p, "state": s} for r, c, p, s in n.actors],
            }
            for n in cluster.actors(sid)
        ]
        _seen_on_nodes(entry["nodes"], process_record.read_records(out / run / "engine"), str(out / run / "output"))
        jobs[run] = entry
    spans = bool(jobs) and all(
        job["nodes"] and all("actor" in n["roles"] for n in job["nodes"]) for job in jobs.values()
    )
    seen = bool(jobs) and all(n["job_env"] and n["entry_point"] for job in jobs.values() for n in job["nodes"])
    succeeded = bool(jobs) and all(job["status"] == "SUCCEEDED" for job in jobs.values())
    return {
        "nodes": cluster.nodes,
        "gpus_per_node": cluster.gpus_per_node,
        "dashboard": cluster.dashboard_url,
        "temp_dir": cluster.temp_dir,
        "ray_version": _ray_version(),
        "launcher": str(RUN_RAY),
        "jobs": jobs,
        "spans_nodes": spans,
        "job_env_on_every_node": seen,
        "ok": spans and seen and succeeded,
    }


def cluster_lines(cluster: dict[str, Any]) -> list[str]:
    """The cluster section of the console summary and ``report.md``: for each job, its status and which node ran
    which of verl's roles, and whether the job's variables and the plugin's entry point reached each node."""
    lines = [
        f"cluster: {cluster['nodes']} Ray nodes on this machine, {cluster['gpus_per_node']} fake GPU(s) each; "
        f"each run submitted by {Path(cluster['launcher']).name} --follow"
    ]
    for run, job in cluster["jobs"].items():
        where = "; ".join(f"{n['node']} ran {', '.join(n['roles']) or 'nothing'}" for n in job["nodes"])
        seen = ", ".join(f"{n['node']} {'yes' if n['job_env'] and n['entry_point'] else 'NO'}" for n in job["nodes"])
        lines.append(
            f"  {run}: job {job['submission_id']} {job['status']}; {where}; job's variables and plugin entry "
            f"point seen by its processes on: {seen}"
        )
    verdict = (
        "ok"
        if cluster["ok"]
        else (
            "FAILED: "
            + ", ".join(
                what
                for what, good in (
                    ("a job did not succeed", all(j["status"] == "SUCCEEDED" for j in cluster["jobs"].values())),
                    ("verl's workers did not run on every node", cluster["spans_nodes"]),
                    (
                        "a node's processes missed the job's variables or the entry point",
                        cluster["job_env_on_every_node"],
                    ),
                )
                if not good
            )
        )
    )
    lines.append(f"  cluster check: {verdict}")
    return lines
