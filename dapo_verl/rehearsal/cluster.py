"""A private multi-node Ray cluster on this machine, for ``dapo-verl rehearse --nodes N``.

:class:`LocalCluster` starts a head node and ``N - 1`` worker nodes with Ray's own command line (``ray start
--head`` with the job server, then ``ray start --address=...``), as a cluster's nodes are started. Every node
advertises its share of fake GPUs (``--num-gpus``: verl places its workers by the GPUs a node advertises, and the
rehearsal's CPU platform runs each "GPU" as a CPU process) and a name (``head``, ``worker-1``, ...). All nodes
share one temporary folder, private to the rehearsal, and every port the nodes would otherwise take from a fixed
default (the head's GCS port, the job server, Ray's client server, each node's dashboard agent) is a free port
chosen at start, so that two rehearsals on one machine do not meet.

What a node's processes inherit is the node's environment: here the CPU platform, vLLM's CPU settings and the
bridges' private folder (what makes this machine's nodes look like GPU nodes to verl). What a job brings -- the
recipe's paths, the plugin modules, the run's record folder -- reaches the job through its runtime environment
(``recipes/run_ray.sh``), as on a cluster.

``ray start`` leaves its daemons running in the session it started in; each ``ray start`` runs in a session of its
own, recorded for :class:`dapo_verl.rehearsal.reaper.Watchdog` (:func:`dapo_verl.rehearsal.reaper.record_session`), and
:meth:`LocalCluster.stop` stops those sessions and every process naming the cluster's folder, whatever ended the
rehearsal. :meth:`LocalCluster.actors` reads, from Ray's state API, which node ran each actor of a job.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_verl import lifetime
from dapo_verl.rehearsal import reaper

__all__ = ["ROLES", "ClusterError", "LocalCluster", "NodeActors", "free_ports", "role_of"]

ROLES = {
    "WorkerDict": "actor",
    "vLLMHttpServer": "rollout",
    "CpuRolloutServer": "rollout",
    "GlobalRequestLoadBalancer": "rollout router",
    "RewardLoopWorker": "reward",
    "TransferQueueController": "transfer queue",
    "SimpleStorageUnit": "transfer queue",
    "AgentLoopWorker": "agent loop",
    "AgentLoopWorkerTQ": "agent loop",
    "TaskRunner": "trainer",
    "TaskRunnerV1": "trainer",
}
"""verl's actor classes by the role they play (the rest are listed under their class name)."""

_START_TIMEOUT_S = 120.0
_START_ATTEMPTS = 3
"""A node that exits while the cluster starts (a chosen port taken meanwhile by another program) is retried on fresh
ports this many times in all; a node that hangs is not."""


class ClusterError(RuntimeError):
    """The cluster could not start; the message names the node, Ray's last lines and what to do."""


class _NodeExited(Exception):
    """A node's ``ray start`` exited while the cluster started (retried on fresh ports)."""


def _tail(log: Path) -> str:
    """A node log's last three lines, on one line."""
    return " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:]) or "empty"


def role_of(class_name: str) -> str:
    """The role an actor of ``class_name`` plays (its class name when verl gives it no role here). verl's
    colocated workers are a class made in a function (``create_colocated_worker_cls.<locals>.WorkerDict``)."""
    name = class_name.rsplit(".", 1)[-1]
    return ROLES.get(name, name)


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on this machine now (bound together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass(frozen=True)
class NodeActors:
    """The actors of one job that ran on one node: ``node`` (its name), ``node_id``, whether it is the ``head``,
    and ``actors`` as (role, class name, pid, state) tuples."""

    node: str
    node_id: str
    head: bool
    actors: tuple[tuple[str, str, int | None, str], ...]

    @property
    def roles(self) -> list[str]:
        """The roles that ran on the node, each once, in the order first seen."""
        return list(dict.fromkeys(role for role, *_ in self.actors))


class LocalCluster:
    """Ray's head and worker nodes on this machine (see the module docstring).

    Args:
        nodes: How many nodes (>= 2): the head and ``nodes - 1`` workers.
        gpus_per_node: Fake GPUs each node advertises.
        cpus_per_node: Logical CPUs each node advertises (verl's actors mostly wait).
        temp_dir: The cluster's private folder (short: Ray's socket paths must fit 107 bytes).
        records: A folder where each node's session is recorded for the watchdog.
        env: The nodes' environment.
        echo: Prints a console line.
    """

    def __init__(
        self,
        nodes: int,
        gpus_per_node: int,
        temp_dir: str,
        records: Path,
        env: dict[str, str],
        cpus_per_node: int = 8,
        echo: Callable[[str], None] = print,
    ) -> None:
        if nodes < 2:
            raise ValueError(f"nodes={nodes!r}: a multi-node cluster has >= 2 nodes (the head and a worker)")
        self.nodes, self.gpus_per_node, self.cpus_per_node = nodes, gpus_per_node, cpus_per_node
        self.temp_dir, self._records, self._env, self._echo = temp_dir, records, env, echo
        self._sessions: list[int] = []
        self._processes: list[subprocess.Popen[bytes]] = []
        self._choose_ports()

    def _choose_ports(self) -> None:
        gcs, dashboard, client, *agents = free_ports(3 + self.nodes)
        self.gcs_address = f"127.0.0.1:{gcs}"
        self.dashboard_url = f"http://127.0.0.1:{dashboard}"
        self._client_port, self._agent_ports = client, agents

    def node_name(self, index: int) -> str:
        """``head`` for the first node, ``worker-<index>`` for the others."""
        return "head" if index == 0 else f"worker-{index}"

    def _command(self, index: int) -> list[str]:
        ray = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            f"--num-cpus={self.cpus_per_node}",
            f"--num-gpus={self.gpus_per_node}",
            f"--node-name={self.node_name(index)}",
            f"--temp-dir={self.temp_dir}",
            f"--dashboard-agent-listen-port={self._agent_ports[index]}",
            "--disable-usage-stats",
            "--block",
        ]
        if index == 0:
            port = self.gcs_address.rsplit(":", 1)[1]
            dashboard = self.dashboard_url.rsplit(":", 1)[1]
            return [
                *ray,
                "--head",
                f"--port={port}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                f"--ray-client-server-port={self._client_port}",
            ]
        return [*ray, f"--address={self.gcs_address}"]

    def start(self) -> LocalCluster:
        """Start every node and wait until all are alive and the job server answers.

        A free port is only free when it is chosen: another program on the machine (another rehearsal's Ray, say) can
        take it before a node binds it, and the node exits. Such a start is stopped and retried on fresh ports, said
        on the console, up to ``_START_ATTEMPTS`` times in all.

        Raises:
            ClusterError: when a node exits at every attempt, or does not join within two minutes (its log's last
                lines are in the message).
        """
        self._records.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start_nodes()
                break
            except _NodeExited as exited:
                self.stop()
                self._sessions.clear()
                self._processes.clear()
                if attempt == _START_ATTEMPTS:
                    raise ClusterError(f"{exited} at each of {attempt} starts on fresh ports") from None
                self._echo(f"[cluster] {exited}; starting the cluster again on fresh ports")
                self._choose_ports()
        self._echo(
            f"[cluster] {self.nodes} Ray nodes up ({', '.join(self.node_name(i) for i in range(self.nodes))}; "
            f"{self.gpus_per_node} fake GPU(s) each); job server {self.dashboard_url}; folder {self.temp_dir}"
        )
        return self

    def _start_nodes(self) -> None:
        for index in range(self.nodes):
            log = self._records / f"{self.node_name(index)}.log"
            with open(log, "w") as sink:  # --block: the command lives as long as the node, in its own session
                process = subprocess.Popen(
                    lifetime.dying_with_this_process(self._command(index)),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    start_new_session=True,
                )
            reaper.record_session(self._records, process.pid)
            self._sessions.append(process.pid)
            self._processes.append(process)
            self._wait(lambda joined=index + 1: self._alive_nodes() >= joined, index, log)  # type: ignore[misc]
        self._wait(self._job_server_answers, 0, self._records / "head.log")

    def _wait(self, ready: Callable[[], bool], index: int, log: Path) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not ready():
            ended = next((p for p in self._processes if p.poll() is not None), None)
            if ended is not None:  # the node waited for, or one that had joined before it
                node = self.node_name(self._processes.index(ended))
                log = self._records / f"{node}.log"
                raise _NodeExited(f"Ray node {node} exited with status {ended.returncode} ({log}: {_tail(log)})")
            if time.monotonic() > deadline:
                tail = _tail(log)
                raise ClusterError(
                    f"Ray node {self.node_name(index)} did not come up within {_START_TIMEOUT_S:.0f} s ({log}: "
                    f"{tail}); a machine busy with other work can be too slow: run the same command again."
                )
            time.sleep(0.5)

    def _alive_nodes(self) -> int:
        with contextlib.suppress(Exception):  # the head is not up yet
            return sum(1 for node in self._state("list_nodes") if node.state == "ALIVE")
        return 0

    def _job_server_answers(self) -> bool:
        from ray.job_submission import JobSubmissionClient

        with contextlib.suppress(Exception):
            JobSubmissionClient(self.dashboard_url).list_jobs()
            return True
        return False

    def _state(self, what: str, **filters: Any) -> list[Any]:
        from ray.util import state

        listing = getattr(state, what)
        return list(listing(address=self.dashboard_url, limit=10_000, raise_on_missing_output=False, **filters))

    def job_id(self, submission_id: str) -> str | None:
        """The Ray job id of the submitted job ``submission_id`` (None when the cluster does not know it)."""
        from ray.job_submission import JobSubmissionClient

        with contextlib.suppress(Exception):
            return JobSubmissionClient(self.dashboard_url).get_job_info(submission_id).job_id
        return None

    def actors(self, submission_id: str) -> list[NodeActors]:
        """Which node ran each actor of the job ``submission_id``, from Ray's state API (dead actors included),
        one entry per node of the cluster in the order the nodes were started."""
        job = self.job_id(submission_id)
        nodes = {node.node_id: node for node in self._state("list_nodes")}
        found: dict[str, list[tuple[str, str, int | None, str]]] = {node_id: [] for node_id in nodes}
        if job is not None:
            for actor in self._state("list_actors", filters=[("job_id", "=", job)], detail=True):
                found.setdefault(actor.node_id, []).append(
                    (role_of(actor.class_name), actor.class_name, actor.pid, actor.state)
                )
        order = {self.node_name(i): i for i in range(self.nodes)}
        entries = [
            NodeActors(
                nodes[node_id].node_name if node_id in nodes else "?",
                node_id,
                bool(nodes[node_id].is_head_node) if node_id in nodes else False,
                tuple(sorted(actors, key=lambda a: (a[0], a[1], a[2] or 0))),
            )
            for node_id, actors in found.items()
        ]
        return sorted(entries, key=lambda entry: order.get(entry.node, len(order)))

    def stop(self) -> None:
        """Stop every node and everything they started: the sessions of the ``ray start`` commands, then every
        process naming the cluster's folder (idempotent)."""
        for session in self._sessions:
            reaper.kill_session(session)
        reaper.kill_marked(self.temp_dir)

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *_: object) -> None:
        self.stop()
