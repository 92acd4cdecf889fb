"""A pytest plugin that measures the CPU time each test costs, its processes' included: ``-p tools.cpu_time``.

Wall time says little about a suite that runs on two cores beside itself: two rehearsals side by side each take
about twice as long. CPU time does not depend on what else runs, so it gives the suite's bound: on ``C`` cores the
suite cannot take less than its CPU seconds over ``C``, however its tests are ordered.

Each pytest process (each xdist worker) moves itself into a cgroup of its own under the cgroup-v1 ``cpuacct``
controller. Every process a test starts inherits that group and stays in it when it leaves its session or its
parent dies (Ray's daemons, vLLM's engine processes), so the group's counter holds all of them. A test is charged
the counter's growth over its setup, call and teardown (a module fixture: the first test that uses it).

Written to ``$DAPO_CPU_TIME_OUT`` (default ``cpu_time``), one JSON file per pytest process, each line a test:
``{"test", "cpu_s", "wall_s"}``. ``python -m tools.cpu_time FOLDER`` sums them and lists the costliest. Needs a
writable ``/sys/fs/cgroup/cpuacct`` (root on a cgroup-v1 machine); elsewhere the plugin says so and measures
nothing. A measuring tool for developers: CI does not load it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class _Group:
    def __init__(self, name: str) -> None:
        self.path = CPUACCT / "dapo-verl-tests" / name
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_s(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def leave(self) -> None:
        """Move this process back to the root group and remove the group (kept while a process is still in it)."""
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        for group in (self.path, self.path.parent):
            try:
                group.rmdir()
            except OSError:
                return


_group: _Group | None = None
_rows: list[dict[str, object]] = []


def pytest_configure(config: pytest.Config) -> None:
    global _group
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    try:
        _group = _Group(f"{name}-{os.getpid()}")
    except OSError as err:
        print(f"tools.cpu_time: cannot use {CPUACCT} ({err}); measuring nothing", file=sys.stderr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if _group is None:
        yield
        return
    cpu, wall = _group.cpu_s(), time.monotonic()
    yield
    _rows.append({"test": item.nodeid, "cpu_s": _group.cpu_s() - cpu, "wall_s": time.monotonic() - wall})


def pytest_unconfigure(config: pytest.Config) -> None:
    if _group is None:
        return
    if _rows:
        out = Path(os.environ.get("DAPO_CPU_TIME_OUT", "cpu_time"))
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{_group.path.name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in _rows))
    _group.leave()


def main(folder: str, top: int = 40) -> None:
    rows = [json.loads(line) for path in Path(folder).glob("*.jsonl") for line in path.read_text().splitlines()]
    rows.sort(key=lambda row: -row["cpu_s"])
    total = sum(row["cpu_s"] for row in rows)
    print(f"{len(rows)} tests, {total:,.0f} CPU-s in all ({total / 2 / 60:.1f} min on 2 cores at best)")
    for row in rows[:top]:
        print(f"{row['cpu_s']:8.0f} CPU-s {row['wall_s']:8.0f} s  {row['test']}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
