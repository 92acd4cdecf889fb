"""What each process of a rehearsal run saw: its node, the job's variables, and verl's plugin entry point.

:mod:`.cpu_plugin` calls :func:`record_process` in every process that imports verl (driver, TaskRunner, workers,
rollout servers) when the run's record folder is set. It writes ``<records>/processes/<pid>.json``:

* ``node_id``: the Ray node the process runs on (None in a driver, which imports verl before ``ray.init``);
* ``env``: the variables a job brings (:data:`JOB_VARIABLES`) as the process sees them -- on a cluster they reach a
  worker only through the job's runtime environment, so a value here on a worker node shows it arrived;
* ``entry_point``: verl's ``verl.plugins`` entry point of dapo_verl as ``importlib.metadata`` finds it in this
  process's environment, and whether loading it gave ``dapo_verl.adapter.register`` (verl loads every entry point
  of the group in ``import verl`` unless ``VERL_USE_EXTERNAL_PLUGINS`` says otherwise, ``plugins_policy``).

:func:`read_records` reads them back for the report. Standard library only; a failure to record is never the run's.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

__all__ = ["JOB_VARIABLES", "read_records", "record_process"]

JOB_VARIABLES = (
    "DAPO_MODEL_PATH",
    "DAPO_DATA_DIR",
    "DAPO_OUTPUT_DIR",
    "VERL_FILE_LOGGER_ROOT",
    "VERL_USE_EXTERNAL_MODULES",
)
"""What ``recipes/run_ray.sh`` sends with a job."""

_FOLDER = "processes"
_REGISTER = "dapo_verl.adapter.register"


def _node_id() -> str | None:
    ray = sys.modules.get("ray")
    with contextlib.suppress(Exception):
        if ray is not None and ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    return None


def _entry_point() -> dict[str, Any]:
    found = [ep for ep in entry_points(group="verl.plugins") if ep.value == _REGISTER]
    loaded = False
    with contextlib.suppress(Exception):
        loaded = bool(found) and getattr(found[0].load(), "__name__", "") == _REGISTER
    return {
        "found": [f"{ep.name} = {ep.value}" for ep in found],
        "loads": loaded,
        "plugins_policy": os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto"),
    }


def record_process(records: Path) -> None:
    """Write this process's record into ``records`` (see the module docstring); never raises."""
    with contextlib.suppress(Exception):
        folder = records / _FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "pid": os.getpid(),
            "node_id": _node_id(),
            "argv0": sys.argv[0] if sys.argv else "",
            "env": {name: os.environ.get(name) for name in JOB_VARIABLES},
            "entry_point": _entry_point(),
        }
        (folder / f"{os.getpid()}.json").write_text(json.dumps(record))


def read_records(records: Path) -> list[dict[str, Any]]:
    """Every process record under ``records``, by pid (unreadable ones skipped: a process killed mid-write)."""
    found = []
    for path in sorted((records / _FOLDER).glob("*.json")):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    return sorted(found, key=lambda record: record.get("pid", 0))
