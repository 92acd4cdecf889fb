"""The rehearsal's bridges that need no verl run: recorded /dev/shm leftovers, request seeds, the weight-sync check,
the stand-in's response lengths, the engine's request records."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from multiprocessing import shared_memory
from types import SimpleNamespace

import pytest

from dapo_verl.preflight import ConfigRefused
from dapo_verl.rehearsal.bridges import cpu_leftovers, cpu_vllm, weight_probe
from dapo_verl.rehearsal.bridges.request_seeds import RequestSeeds
from dapo_verl.rehearsal.bridges.response_lengths import length_shape, shape_vllm_request, target_length
from dapo_verl.rehearsal.options import RehearsalOptions
from dapo_verl.rehearsal.run import rehearse
from dapo_verl.sampler.simulated_engine import LongTailLengths

_LEAKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from multiprocessing import resource_tracker, shared_memory
    from dapo_verl.rehearsal.bridges import cpu_leftovers
    cpu_leftovers.track(Path(sys.argv[1]))
    segment = shared_memory.SharedMemory(create=True, size=4096)
    resource_tracker.unregister(segment._name, "shared_memory")  # as a process whose tracker dies with it
    print(segment.name, flush=True)
    time.sleep(60)  # killed: the segment is never unlinked, as when ray.shutdown kills vLLM's engine
""")


def test_what_a_killed_process_created_is_removed_and_nothing_else(tmp_path):
    records = tmp_path / "engine"
    process = subprocess.Popen(
        [sys.executable, "-c", _LEAKER, str(records)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    name = process.stdout.readline().strip()
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    other = shared_memory.SharedMemory(create=True, size=4096)  # someone else's: never recorded
    try:
        assert (cpu_leftovers.SHM_ROOT / name).exists()
        assert cpu_leftovers.recorded_names(records) == [name]
        assert cpu_leftovers.remove_recorded(records) == [(name, 4096)]
        assert not (cpu_leftovers.SHM_ROOT / name).exists()
        assert (cpu_leftovers.SHM_ROOT / other.name).exists()
        assert cpu_leftovers.remove_recorded(records) == []  # already gone: nothing to do
    finally:
        other.close()
        other.unlink()


def test_recorded_names_never_reach_outside_the_shm_folder(tmp_path):
    (tmp_path / "dev-shm-1.txt").write_text("../etc/passwd\npsm_absent\n")
    assert cpu_leftovers.remove_recorded(tmp_path, root=tmp_path / "shm") == []


def test_request_seeds_follow_content_and_occurrence_not_arrival_order():
    params = {"temperature": 1.0, "top_p": 1.0, "logprobs": True}
    a, b = RequestSeeds(3), RequestSeeds(3)
    first = [a.next([5, 6], params, 1) for _ in range(4)]
    a.next([9], params, 1)  # another prompt in between changes nothing for this one
    assert len(set(first)) == 4 and [b.next([5, 6], params, 1) for _ in range(4)] == first
    assert a.next([5, 6], params, 2) != first[0]  # new weights' version, another stream
    assert RequestSeeds(4).next([5, 6], params, 1) != first[0]  # another rollout seed
    a.restart()
    assert a.next([5, 6], params, 1) == first[0]
    assert a.next([5, 6], {**params, "seed": 123}, 1) == first[1]  # a seed given in the request is not hashed
    assert all(0 <= s < 2**64 for s in first)


def _records(folder, engine, references):
    for file, rows in ((weight_probe.ENGINE_RECORDS, engine), (weight_probe.REFERENCE_RECORDS, references)):
        (folder / file).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _probe(when, seq, step, tokens, logp):
    return {"when": when, "seq": seq, "global_steps": step, "tokens": tokens, "log_probs": [logp] * len(tokens)}


def _reference(step, tokens, logp):
    return {"global_steps": step, "tokens": tokens, "log_probs": [logp] * len(tokens)}


def test_weight_sync_is_shown_when_the_engine_follows_a_push_that_changed_its_output(tmp_path):
    _records(
        tmp_path,
        [
            _probe("started", 1, None, [7, 7], -6.0),
            _probe("after_push", 2, 0, [3, 3], -1.0),
            _probe("after_push", 3, 1, [3, 3], -0.9999),
        ],
        [_reference(0, [3, 3], -1.0000004), _reference(1, [3, 3], -0.9999002), _reference(2, [3, 4], -0.9)],
    )
    check = weight_probe.weight_sync_check(tmp_path)
    assert check["ok"] and check["pushes"] == 3 and check["initial"]
    first, second, last = check["rows"]
    assert first["tokens_changed"] and first["logp_max_change"] == pytest.approx(5.0)
    assert not second["tokens_changed"] and second["logp_max_diff"] < 1e-6
    assert not last["probed"]  # after the last step no request followed
    assert "1 push(es) had no request after them" in check["reason"]


def test_each_replica_is_paired_with_its_own_pushes(tmp_path):
    # separate_async: a hybrid replica (0) and a standalone one (1), each pushed to; only replica 0 generates later.
    engine = [{**_probe("started", 1, None, [7, 7], -6.0), "replica": r} for r in (0, 1)]
    engine += [{**_probe("after_push", 2, 0, [3, 3], -1.0), "replica": r} for r in (0, 1)]
    engine.append({**_probe("after_push", 3, 1, [3, 3], -0.99), "replica": 0})
    references = [{**_reference(0, [3, 3], -1.0), "replica": r} for r in (0, 1)]
    references += [{**_reference(1, [3, 3], -0.99), "replica": r} for r in (0, 1)]
    _records(tmp_path, engine, references)
    check = weight_probe.weight_sync_check(tmp_path)
    assert check["ok"] and check["pushes"] == 4
    assert [(r["replica"], r["global_steps"], r["probed"]) for r in check["rows"]] == [
        (0, 0, True),
        (0, 1, True),
        (1, 0, True),
        (1, 1, False),
    ]
    # A replica whose engine never answered after a push: not shown for it.
    _records(tmp_path, engine[:2] + engine[2:3] + engine[4:], references)
    check = weight_probe.weight_sync_check(tmp_path)
    assert not check["ok"] and "replicas never probed: [1]" in check["reason"]


def test_an_engine_that_kept_its_old_weights_fails_the_check(tmp_path):
    # The push happened (reference recorded) but the engine still answers with its initial weights.
    _records(
        tmp_path,
        [_probe("started", 1, None, [7, 7], -6.0), _probe("after_push", 2, 0, [7, 7], -6.0)],
        [_reference(0, [3, 3], -1.0), _reference(1, [3, 3], -1.0)],
    )
    check = weight_probe.weight_sync_check(tmp_path)
    assert not check["ok"] and not check["rows"][0]["tokens_equal"]
    assert "1 of 1 probed weight pushes were not followed by an engine output equal" in check["reason"]


def test_a_push_that_changes_nothing_cannot_show_the_sync(tmp_path):
    # load_format=auto: vLLM loaded the actor's weights itself, so the push leaves its output as it was.
    _records(
        tmp_path,
        [_probe("started", 1, None, [3, 3], -1.0), _probe("after_push", 2, 0, [3, 3], -1.0)],
        [_reference(0, [3, 3], -1.0)],
    )
    check = weight_probe.weight_sync_check(tmp_path)
    assert not check["ok"] and "cannot tell whether the weights reached it" in check["reason"]


def test_no_recorded_push_is_reported_as_such(tmp_path):
    check = weight_probe.weight_sync_check(tmp_path)
    assert not check["ok"] and check["pushes"] == 0 and "no weight push was recorded" in check["reason"]


def _rollout(response_length=64, prompt_length=128, **options):
    return SimpleNamespace(
        response_length=response_length,
        prompt_length=prompt_length,
        engine_kwargs={"dapo_cpu": options} if options else {},
    )


def test_a_vllm_request_is_held_to_its_drawn_length_within_its_budget():
    config = _rollout(response_lengths="long_tail")
    shape = length_shape(config)
    assert shape is not None and shape.median == pytest.approx(0.15 * 64) and length_shape(_rollout()) is None
    lengths = []
    for seed in range(2000):
        params = {"seed": seed, "temperature": 1.0}
        length = shape_vllm_request(params, shape, [1, 2, 3], config)
        assert params["min_tokens"] == params["max_tokens"] == length  # vLLM can neither stop early nor run on
        assert length == min(64, target_length(shape, [1, 2, 3], seed))  # the drawn length, seeded like the tokens
        lengths.append(length)
    lengths.sort()
    assert 6 <= lengths[1000] <= 13 and lengths[1800] >= 2 * lengths[1000]  # median near 0.15 x 64, a long tail
    assert 0 < lengths.count(64) < 100  # a few run to the budget (truncated)
    # verl's default budget leaves room for the prompt within prompt + response lengths ...
    short = {"seed": 1}
    assert shape_vllm_request(short, LongTailLengths(median=1000.0), list(range(180)), config) == 12  # 192 - 180
    # ... and a continued request brings what is left of its budget (verl's partial-rollout client)
    continued = {"seed": 1, "max_tokens": 5}
    assert shape_vllm_request(continued, LongTailLengths(median=1000.0), [1], config) == 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"response_lengths": "pareto"}, "response_lengths='pareto'; expected model"),
        ({"response_lengths": "long_tail", "median_fraction": 1.5}, "median_fraction=1.5; expected a share"),
        ({"lengths": "long_tail"}, "unknown keys \\['lengths'\\]"),
        (
            {"response_lengths": "long_tail", "temperature": 0.7},
            "on vLLM needs actor_rollout_ref.rollout.temperature=1.0, not 0.7",
        ),
    ],
)
def test_bad_length_options_are_refused_before_a_rehearsal_starts(tmp_path, options, message):
    options = dict(options)
    temperature = (
        [f"actor_rollout_ref.rollout.temperature={options.pop('temperature')}"] if "temperature" in options else []
    )
    overrides = [f"+actor_rollout_ref.rollout.engine_kwargs.dapo_cpu.{k}={v}" for k, v in options.items()]
    out = tmp_path / "never"
    with pytest.raises(ConfigRefused, match=message) as refused:
        rehearse(
            RehearsalOptions(
                config_name="dapo_trainer", overrides=(*overrides, *temperature), out_dir=out, engine="vllm"
            ),
            echo=lambda line: None,
        )
    assert refused.value.problems[0].key == "actor_rollout_ref.rollout.engine_kwargs.dapo_cpu"
    assert not out.exists()  # refused before anything was written


def _server_module():
    """A stand-in for verl's ``vLLMHttpServer`` with the four methods the bridge wraps, shaped as verl's: ``generate``
    parks a request at the closed gate (``_park_until_admitted``) until a weight update opens it. The bridge is tested
    here without vLLM (the e2e rehearsals run it on verl's real server); generation fails for a request named 'fail'."""

    class Server:
        def __init__(self):
            self.config = SimpleNamespace(seed=0, engine_kwargs={})
            self.replica_rank, self.node_rank, self.global_steps, self.gate_closed = 0, 1, 3, False

        async def generate(self, prompt_ids, sampling_params, request_id):
            if self.gate_closed:
                await self._park_until_admitted(request_id)
            if request_id == "fail":
                raise RuntimeError("engine failed")
            return SimpleNamespace(token_ids=[1, 2, 3])

        async def launch_server(self):
            return None

        async def clear_kv_cache(self):
            return None

        async def _park_until_admitted(self, request_id):
            await asyncio.sleep(0.2)  # the training step the request waits out
            self.global_steps, self.gate_closed = self.global_steps + 1, False

    return SimpleNamespace(vLLMHttpServer=Server)


def test_a_request_is_recorded_from_its_admission_under_the_weights_it_was_admitted_with(tmp_path):
    module = _server_module()
    cpu_vllm._patch_http_server(module, tmp_path)
    server = module.vLLMHttpServer()

    async def requests():
        await server.generate([5, 6], {}, "open")  # the gate is open: recorded from its arrival, step 3's weights
        server.gate_closed = True
        arrived = time.time()
        await server.generate([5, 6], {}, "parked")  # waits at the gate, let in under step 4's weights
        server.gate_closed = True
        with pytest.raises(RuntimeError, match="engine failed"):
            await server.generate([5, 6], {}, "fail")
        return arrived

    arrived = asyncio.run(requests())
    records = [
        json.loads(line) for line in (tmp_path / cpu_vllm.REQUESTS.format(pid=os.getpid())).read_text().splitlines()
    ]
    assert [(r["weights"], r["tokens"]) for r in records] == [(3, 3), (4, 3)]
    assert records[1]["start"] >= arrived + 0.2  # the wait at the gate is not generation time
    assert server.__dict__["_dapo_rehearsal"]["admitted"] == {}  # a failed request leaves no admission behind


def test_a_probe_cut_short_by_an_abort_is_compared_as_a_prefix(tmp_path):
    # colocate_async with streaming aborts every request in flight once the batch is full, the probe among them.
    engine = [
        _probe("started", 1, None, [7, 7, 7], -6.0),
        _probe("after_push", 2, 0, [3, 3, 3], -1.0),
        _probe("after_push", 3, 1, [3], -0.99),  # aborted after one token
        _probe("after_push", 4, 2, [], -0.9),  # aborted before any: shows nothing
        _probe("after_push", 5, 2, [3, 4, 4], -0.9),  # the next request's probe after the same push
    ]
    references = [_reference(0, [3, 3, 3], -1.0), _reference(1, [3, 3, 3], -0.99), _reference(2, [3, 4, 4], -0.9)]
    _records(tmp_path, engine, references)
    check = weight_probe.weight_sync_check(tmp_path)
    assert check["ok"], check
    assert [(r["global_steps"], r["probe_tokens"], r["tokens_equal"]) for r in check["rows"]] == [
        (0, 3, True),
        (1, 1, True),
        (2, 3, True),
    ]
    # A prefix that disagrees with the reference still fails.
    engine[2] = _probe("after_push", 3, 1, [5], -0.99)
    _records(tmp_path, engine, references)
    assert not weight_probe.weight_sync_check(tmp_path)["ok"]
