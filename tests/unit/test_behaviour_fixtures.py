"""Today's behaviour, recorded under ``tests/data/behaviour/`` by ``tools/record_behaviour.py``, is still today's.

Each fixture is regenerated in memory and compared with the committed file: the sampler's steps, metrics and states,
every command's ``--help``, each recipe's composed config (all exactly), and a short local run's metrics (within
``LOCAL_RUN_TOLERANCE``, since another CPU or library version can change a run's last bits).
"""

from __future__ import annotations

import json
import math

import pytest

from tools.record_behaviour import (
    FIXTURE_DIR,
    LOCAL_RUN,
    LOCAL_RUN_TOLERANCE,
    WRITE_HINT,
    first_difference,
    fixture_producers,
    local_run_difference,
    local_run_record,
    recorded_files,
)

PRODUCERS = fixture_producers()


def _numbers(metrics):
    """A record's metrics with null (metrics.jsonl's NaN, e.g. a mean over no token) as NaN, for pytest.approx."""
    return {key: math.nan if value is None else value for key, value in metrics.items()}


@pytest.mark.parametrize("name", sorted(PRODUCERS))
def test_the_fixture_is_todays_behaviour(name):
    path = FIXTURE_DIR / name
    assert path.is_file(), f"{name} is not recorded: {WRITE_HINT}."
    recorded, current = path.read_text(), PRODUCERS[name]()
    assert current == recorded, f"{name} differs at {first_difference(name, recorded, current)}: {WRITE_HINT}."


def test_every_recorded_file_has_a_producer():
    orphans = sorted(recorded_files() - set(PRODUCERS) - {LOCAL_RUN})
    assert not orphans, f"nothing produces {', '.join(orphans)} any more: {WRITE_HINT}."


@pytest.mark.e2e
def test_a_short_local_run_gives_the_recorded_metrics(tmp_path):
    recorded = json.loads((FIXTURE_DIR / LOCAL_RUN).read_text())
    current = local_run_record(tmp_path)
    where = (
        f"{LOCAL_RUN} differs at {local_run_difference(recorded, current)} (recorded on "
        f"{recorded['environment']}, now on {current['environment']}): {WRITE_HINT}."
    )
    assert current["overrides"] == recorded["overrides"], where
    assert [r["step"] for r in current["records"]] == [r["step"] for r in recorded["records"]], where
    for now, then in zip(current["records"], recorded["records"]):
        assert _numbers(now["data"]) == pytest.approx(_numbers(then["data"]), nan_ok=True, **LOCAL_RUN_TOLERANCE), where
