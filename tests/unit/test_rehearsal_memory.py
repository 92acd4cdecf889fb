"""The rehearsal's memory sampler sums the resident memory of every process of a run, and says when memory ran out.

:class:`dapo_verl.rehearsal.memory.MemorySampler` is driven here with real child processes of known size standing in
for a run's processes: a driver leading a session of its own (recorded as a run's launch records it), a child in
its process group, and a daemon in a session of its own that names the run's private folder in its command line,
as Ray's daemons do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dapo_verl.rehearsal import memory, reaper
from dapo_verl.rehearsal.memory import (
    MemoryPeaks,
    MemorySampler,
    Peak,
    Watched,
    memory_kill,
    out_of_memory_line,
    resident_bytes,
)

MIB = 2**20
_HOLD = "import sys, time; block = b'\\x01' * ({mib} * 2**20); print('held', flush=True); time.sleep({hold_s})"
_DRIVER = textwrap.dedent("""
    import subprocess, sys, time
    hold = sys.argv[1]
    child = subprocess.Popen([sys.executable, "-c", hold.format(mib=64, hold_s=60)], stdout=subprocess.PIPE)
    daemon = subprocess.Popen([sys.executable, "-c", hold.format(mib=32, hold_s=60), sys.argv[2]],
                              stdout=subprocess.PIPE, start_new_session=True)
    assert child.stdout.readline() and daemon.stdout.readline()
    block = b"\\x01" * (96 * 2**20)
    print(child.pid, daemon.pid, flush=True)
    time.sleep(60)
""")


def _start(*command: str, **options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", *command], stdout=subprocess.PIPE, text=True, **options)


@pytest.fixture
def run_processes(tmp_path):
    """A run of three processes holding 96, 64 and 32 MiB, its session recorded in its record folder; and a process
    of this test's that is not the run's (16 MiB)."""
    marker, records = str(tmp_path / "dvr-marker"), tmp_path / "engine"
    records.mkdir()
    driver = _start(_DRIVER, _HOLD, marker, start_new_session=True)
    other = _start(_HOLD.format(mib=16, hold_s=60), start_new_session=True)
    try:
        pids = [driver.pid, *map(int, driver.stdout.readline().split())]
        assert other.stdout.readline() == "held\n"
        reaper.record_session(records, driver.pid)
        yield Watched("run1", marker, records), pids, other.pid
    finally:
        reaper.kill_session(driver.pid)
        reaper.kill_marked(marker)
        for process in (driver, other):
            process.kill()
            process.wait()


def test_a_sample_sums_the_resident_memory_of_each_process_of_the_run_and_of_the_whole_rehearsal(run_processes):
    watched, pids, other = run_processes
    sampler = MemorySampler([watched])
    members = sampler.members()
    assert members["run1"] == set(pids)  # the driver, its child, and the daemon in a session of its own
    assert other not in members["run1"] and {other, *pids} <= members[None]  # the test's own child counts in total
    sampler.sample()
    peaks = sampler.peaks
    run = peaks.runs["run1"]
    assert run.processes == 3 and peaks.samples == 1
    assert run.bytes >= (96 + 64 + 32) * MIB  # what the three hold, plus each interpreter
    assert run.bytes == pytest.approx(sum(resident_bytes(pid) for pid in pids), rel=0.05)
    assert peaks.total.bytes >= (run.bytes + resident_bytes(other) + resident_bytes(os.getpid())) * 0.95
    assert peaks.total.processes >= 5  # this process, the run's three, the other child
    assert peaks.available_min_bytes is None or peaks.available_min_bytes > 0


_FORKED = textwrap.dedent("""
    import os, sys, time
    block = bytearray(b"\\x01" * (192 * 2**20))  # touched: resident, then shared copy-on-write by the children
    for _ in range(2):
        if os.fork() == 0:  # a child holds the block it shares with the parent until it is killed
            time.sleep(60)
            os._exit(0)
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_page_three_processes_share_counts_once_in_the_proportional_sum_and_three_times_in_the_rss_sum(tmp_path):
    marker, records = str(tmp_path / "dvr-marker"), tmp_path / "engine"
    records.mkdir()
    parent = _start(_FORKED, marker, start_new_session=True)
    try:
        assert parent.stdout.readline() == "held\n"
        sampler = MemorySampler([Watched("run1", marker, records)])
        deadline = time.monotonic() + 10
        while len(sampler.members()["run1"]) < 3 and time.monotonic() < deadline:  # the forks print nothing
            time.sleep(0.05)
        sampler.sample(pss=True)
        peaks = sampler.peaks
        rss, pss = peaks.runs["run1"], peaks.runs_pss["run1"]
        assert rss.processes == pss.processes == 3
        assert rss.bytes >= 3 * 192 * MIB  # each process maps the whole block
        assert 192 * MIB <= pss.bytes <= rss.bytes - 2 * 160 * MIB  # the block once, split among the three
        assert peaks.pss.bytes >= pss.bytes and peaks.pss_interval_s == 2.0
    finally:
        reaper.kill_session(parent.pid)
        parent.wait()


def test_the_proportional_sizes_are_read_when_rss_rises_at_every_nth_sample_and_when_the_sampler_stops(
    tmp_path, monkeypatch
):
    # Every process of the rehearsal (this one, and whatever pytest started) is given the same sizes, so that each
    # sample's sums are known; what is checked is when the sampler pays for reading smaps_rollup.
    rss, reads = {"bytes": 100 * MIB}, []
    monkeypatch.setattr(memory, "resident_bytes", lambda pid: rss["bytes"])
    monkeypatch.setattr(memory, "proportional_bytes", lambda pid: reads.append(pid) or rss["bytes"] // 2)
    sampler = MemorySampler(
        [Watched("run1", str(tmp_path / "dvr-none"), tmp_path / "absent")], interval_s=0.01, pss_every=3
    )

    def read_at_sample() -> bool:
        before = len(reads)
        sampler.sample()
        return len(reads) > before

    assert read_at_sample()  # the first: a new RSS peak, and due
    assert not read_at_sample() and not read_at_sample()  # no new RSS peak, not due
    assert read_at_sample()  # the third after the first: due, and the RSS sum (100) could beat the PSS peak (50)
    rss["bytes"] = 300 * MIB
    assert read_at_sample()  # a new RSS peak
    assert sampler.peaks.pss.bytes == sampler.peaks.total.bytes // 2
    rss["bytes"] = 120 * MIB
    assert not read_at_sample() and not read_at_sample()  # due now, but 120 cannot beat the PSS peak of 150
    sampler.start()
    before = len(reads)
    sampler.stop()
    assert len(reads) > before  # the last sample always reads them
    with pytest.raises(ValueError, match="pss_every=0: expected a whole number of samples >= 1"):
        MemorySampler([], pss_every=0)
    with pytest.raises(ValueError, match=r"pss_share=0: expected a share of the time in \(0, 1\]"):
        MemorySampler([], pss_share=0)


def test_the_proportional_sizes_take_no_more_than_their_share_of_the_time(tmp_path, monkeypatch):
    # Each read is made to take 50 ms; at a share of 1/4 the next may begin about 4 times its duration after one
    # began, however fast the RSS sum rises meanwhile (while runs start it sets a new peak at nearly every sample).
    rss, reads = {"bytes": 100 * MIB}, []

    def slow_read(pid):
        if not reads or reads[-1][0] != rss["bytes"]:  # one sleep a sample, whatever the number of processes
            began = time.monotonic()
            time.sleep(0.05)
            reads.append((rss["bytes"], began, time.monotonic()))
        return rss["bytes"] // 2

    def rise_and_sample():
        rss["bytes"] += MIB  # a new RSS peak at every sample
        sampler.sample()

    monkeypatch.setattr(memory, "resident_bytes", lambda pid: rss["bytes"])
    monkeypatch.setattr(memory, "proportional_bytes", slow_read)
    sampler = MemorySampler([Watched("run1", str(tmp_path / "dvr-none"), tmp_path / "absent")], pss_share=0.25)
    sampler.sample()  # the first read
    (_, first, first_end), rising = reads[0], 0
    while time.monotonic() - first < 0.19:
        rise_and_sample()
        rising += 1
    assert len(reads) == 1 and rising > 3  # every rise within 4 x 50 ms went unread
    deadline = time.monotonic() + 5
    while len(reads) == 1 and time.monotonic() < deadline:
        rise_and_sample()
    assert len(reads) == 2 and sampler.peaks.pss_reads == 2  # ... and the next rise after them was read
    waited = reads[1][1] - first
    assert 4 * (first_end - first) - 0.01 <= waited < 4 * (first_end - first) + 1.0
    sampler.sample(pss=True)  # a read asked for (the last sample's) is never held back
    # Each process the sampler counts (this one, and any child an earlier test left running in it) reads half the RSS.
    peak = sampler.peaks.pss
    assert sampler.peaks.pss_reads == 3 and peak.processes >= 1 and peak.bytes == peak.processes * (rss["bytes"] // 2)


def test_the_peak_stays_after_the_processes_that_made_it_have_ended(tmp_path):
    marker, records = str(tmp_path / "dvr-marker"), tmp_path / "engine"
    records.mkdir()
    sampler = MemorySampler([Watched("run1", marker, records)], interval_s=0.05).start()
    brief = _start(_HOLD.format(mib=128, hold_s=1), marker)
    assert brief.stdout.readline() == "held\n"
    time.sleep(0.3)  # a few samples while it holds its block
    brief.wait()
    peaks = sampler.stop()
    assert peaks.runs["run1"].bytes >= 128 * MIB and peaks.runs["run1"].processes == 1
    assert sampler.members()["run1"] == set()  # gone now, yet its peak is kept
    assert peaks.samples >= 3 and peaks.runs["run1"].at_s is not None


def test_nothing_of_a_run_is_found_before_it_starts(tmp_path):
    sampler = MemorySampler([Watched("run2", str(tmp_path / "dvr-none"), tmp_path / "absent")])
    sampler.sample()
    assert sampler.peaks.runs["run2"] == Peak()


_RAY_OOM = (
    "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
    "Memory on the node (IP: 10.0.0.1, ID: 5f3e) was 22.91GB used / 24.00GB limit (0.954651)"
)


def test_rays_memory_monitor_in_the_log_is_a_memory_kill():
    found = memory_kill(f"step:1 - loss:0.3\n{_RAY_OOM}\n", 1, 4, 4)
    assert found is not None and found.startswith("Ray's memory monitor killed a worker ('ray.exceptions.OutOfMemory")
    assert memory_kill("(raylet) 1 worker(s) were killed due to the node running low on memory.", 1, None, None)


def test_the_kernels_oom_killer_is_told_by_its_count_or_where_there_is_none_by_sigkill():
    assert "the kernel's OOM killer killed 2 process(es)" in memory_kill("ActorDiedError: ...", 1, 7, 9)
    assert "killed by SIGKILL (exit -9)" in memory_kill("", -signal.SIGKILL, None, None)
    assert "killed by SIGKILL (exit 137)" in memory_kill("", 137, None, None)
    assert memory_kill("", -signal.SIGKILL, 7, 7) is None  # the count did not grow: someone else's kill -9


def test_a_failure_with_no_sign_of_memory_is_not_a_memory_kill():
    assert memory_kill("ValueError: the reward function raised\n", 1, 3, 3) is None
    assert memory_kill("torch.OutOfMemory is not mentioned here", 1, None, None) is None


def test_the_out_of_memory_line_names_the_peak_and_the_fix():
    peaks = MemoryPeaks(
        Peak(14 * 2**30, 60, 100.0),
        {"run1": Peak(7 * 2**30, 30, 90.0)},
        int(0.8 * 2**30),
        pss=Peak(10 * 2**30, 60, 100.0),
        runs_pss={"run1": Peak(5 * 2**30, 30, 90.0)},
    )
    line = out_of_memory_line("run1", "run1", "Ray's memory monitor killed a worker ('...')", peaks, overlap=True)
    assert line.startswith(
        "run1 was killed for lack of memory: Ray's memory monitor killed a worker ('...'); the "
        "rehearsal's processes held up to 10.0 GiB (run1: 5.0 GiB; the sum of their proportional "
        "set sizes, that of their RSS up to 14.0 GiB), and this machine had 0.8 GiB available at "
        "the least. Close other work"
    )
    assert "without --overlap-resume" in line and "\n" not in line
    assert "--overlap-resume" not in out_of_memory_line("run1", "run1", "x", peaks, overlap=False)


def test_resident_bytes_of_a_process_that_is_gone_is_zero():
    process = _start("pass")
    process.wait()
    assert resident_bytes(process.pid) == 0 and resident_bytes(-1) == 0
