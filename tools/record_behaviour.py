"""Record today's behaviour as fixtures under ``tests/data/behaviour/``, so that a redesign can show it changed none of
it, or its commit says why it did (``tests/unit/test_behaviour_fixtures.py`` compares them).

Usage, from the repository root::

    python -m tools.record_behaviour --write   # regenerate every fixture
    python -m tools.record_behaviour --check   # exit 1 naming each fixture that differs from today's behaviour

The fixtures:

* ``sampler/<run>.json``: the batch replenisher over :data:`SAMPLER_STEPS` steps in each of :data:`SAMPLER_RUNS`
  (round-based runs on :class:`~dapo_verl.sampler.simulation.SimulatedPolicy`, the streaming one on
  :class:`~dapo_verl.sampler.simulated_engine.SimulatedEngine`, all seeded): per step the trained groups' prompt ids
  with each group's correct responses (its reward summary: both simulations score a response +1 if correct, else
  -1) and response tokens; every metric, one list of per-step values per key (``null`` where a step did not
  return the key); and ``state_dict()`` after the steps in
  :data:`STATE_STEPS`. A tensor in a state is recorded as its dtype, shape and values, or, beyond
  :data:`MAX_TENSOR_VALUES` values (the prompt stream's random generator state), its dtype, shape and the SHA-256
  of its bytes.
* ``help/<command>.txt``: ``dapo-verl <command> --help`` for every subcommand, and ``help/dapo-verl.txt`` for the
  top level, rendered at :data:`HELP_COLUMNS` columns (argparse's layout is Python's: these are Python 3.11's).
* ``recipes/<config>.yaml``: each recipe's composed config, unresolved (``${oc.env:DAPO_MODEL_PATH}`` kept as
  written). The repository's absolute path would be written as ``<repository>``; no recipe holds it today, nor any
  other path of this machine (``/tmp/ray/session_latest/...`` is a literal default of verl's config, kept).
* ``local_run.json``: the metrics (``metrics.jsonl``, without the wall-clock ``timing_s/*`` keys) of a short local
  run (:data:`LOCAL_RUN_OVERRIDES`), and the numeric environment it ran in
  (:func:`dapo_verl.local.session.numeric_environment`, as the run's ``summary.json`` records it). Another CPU or
  library version can change a run's last bits, so this fixture is compared within :data:`LOCAL_RUN_TOLERANCE`
  and its environment is information, not compared.

Floats are rounded to :data:`SIGNIFICANT_DIGITS` significant digits and JSON keys are sorted, so the files are
stable text. The full list of config keys with their defaults is not recorded here: its generated and checked
home is ``docs/configuration.md`` (``dapo-verl config --check``, ``tests/unit/test_config_yaml.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_DIR = ROOT / "tests" / "data" / "behaviour"
SIGNIFICANT_DIGITS = 10

SAMPLER_STEPS = 60
STATE_STEPS = (30, 60)
SAMPLER_PROMPTS = 300
SAMPLER_GROUP_SIZE = 8
SAMPLER_BATCH = {"train_batch_size": 16, "seed": 0}
SAMPLER_RUNS: dict[str, dict[str, Any]] = {
    "rounds": {},
    "streaming": {"streaming": True},
    "carry": {"surplus": "carry"},
    "predicted": {"prompt_selection": "predicted"},
    "partial": {"on_shortfall": "partial", "max_num_gen_batches": 1, "gen_batch_size": 20},  # 28 of 60 steps short
}
"""Each run's :class:`~dapo_verl.config.SamplerConfig` fields beyond :data:`SAMPLER_BATCH`."""
MAX_TENSOR_VALUES = 64

HELP_COLUMNS = 120
TOP_LEVEL_HELP = "dapo-verl"

RECIPES = (
    "dapo_qwen2.5_32b",
    "dapo_wo_ds_qwen2.5_32b",
    "dapo_qwen2.5_7b",
    "dapo_qwen2.5_math_1.5b",
    "dapo_clip_ablation_eps_high_0.2",
    "dapo_clip_ablation_eps_high_0.28",
    "dapo_trainer",
)
REPOSITORY_PLACEHOLDER = "<repository>"

LOCAL_RUN = "local_run.json"
LOCAL_RUN_OVERRIDES = (
    "trainer.total_training_steps=5",
    "trainer.test_freq=5",
    "trainer.save_freq=-1",
    "data.seed=0",
    "data.train_batch_size=4",
    "data.gen_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
    "local.task.heldout_size=50",
)
LOCAL_RUN_TOLERANCE = {"rel": 1e-4, "abs": 1e-6}
"""How far a local run's metric may be from the recorded one (``pytest.approx``'s ``rel`` and ``abs``): another CPU
or library version can change a run's last bits, and training carries them into every later metric."""

WRITE_HINT = "run `python -m tools.record_behaviour --write` if the change is intended, and say why in the commit"


# -- the batch replenisher ---------------------------------------------------------------------------------------


def sampler_record(run: str) -> dict[str, Any]:
    """The batch replenisher's steps, metrics and states in the run ``run`` of :data:`SAMPLER_RUNS`.

    Returns:
        ``{"config": fields beyond the defaults, "steps": [per-step groups], "metrics": {key: [value per step]},
        "states": {"<step>": state_dict}}``, plain JSON-able data with floats rounded.
    """
    from dapo_verl.config import SamplerConfig
    from dapo_verl.sampler import BatchReplenisher
    from dapo_verl.sampler.simulated_engine import LongTailLengths, SimulatedEngine
    from dapo_verl.sampler.simulation import SimulatedPolicy, drifting_pass_rates

    overrides = {**SAMPLER_BATCH, **SAMPLER_RUNS[run]}
    pass_rate = drifting_pass_rates(SAMPLER_PROMPTS, seed=0)
    if overrides.get("streaming"):  # the engine of tests/unit/test_sampler_streaming.py, at its defaults
        generate: Any = SimulatedEngine(
            pass_rate, group_size=SAMPLER_GROUP_SIZE, lengths=LongTailLengths(200.0), max_response_length=1024, seed=0
        )
    else:
        generate = SimulatedPolicy(pass_rate, group_size=SAMPLER_GROUP_SIZE, seed=0)
    sampler = BatchReplenisher(
        SamplerConfig(**overrides), SAMPLER_PROMPTS, generate, codec=getattr(generate, "codec", None)
    )
    steps, step_metrics, states = [], [], {}
    for step in range(1, SAMPLER_STEPS + 1):
        generate.step = step
        batch = sampler.next_batch()
        steps.append(
            {
                "step": batch.step,
                "partial": batch.is_partial,
                "prompt_ids": [group.prompt_id for group in batch.groups],
                "correct": [int(group.metric.sum()) for group in batch.groups],  # acc is a (G,) bool tensor here
                "tokens": [group.num_tokens for group in batch.groups],
            }
        )
        step_metrics.append(batch.metrics)
        if step in STATE_STEPS:
            states[str(step)] = sampler.state_dict()
    keys = sorted(set().union(*step_metrics))
    metrics = {key: [values.get(key) for values in step_metrics] for key in keys}
    return plain({"config": overrides, "steps": steps, "metrics": metrics, "states": states})


def sampler_fixture(run: str) -> str:
    """``sampler/<run>.json``'s text (:func:`sampler_record`)."""
    return render_json(sampler_record(run))


# -- command-line help -------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    """Set ``COLUMNS`` (argparse's line width) for the duration, then restore it."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def help_texts() -> dict[str, str]:
    """``--help`` of the top level (:data:`TOP_LEVEL_HELP`) and of every subcommand, by command name."""
    from dapo_verl.cli import _parser

    with _columns(HELP_COLUMNS):
        parser = _parser()
        # argparse lists sub-parsers only in private attributes; reading them records a new subcommand unasked
        commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        texts = {TOP_LEVEL_HELP: parser.format_help()}
        texts.update({name: command.format_help() for name, command in commands.choices.items()})
    return texts


def help_fixture(command: str) -> str:
    """``help/<command>.txt``'s text."""
    return help_texts()[command]


# -- recipes -----------------------------------------------------------------------------------------------------


def recipe_fixture(name: str) -> str:
    """``recipes/<name>.yaml``: the recipe composed as its launcher composes it, interpolations unresolved."""
    from omegaconf import OmegaConf

    from dapo_verl.rehearsal.run import compose_recipe

    config, _ = compose_recipe(name, [])
    return OmegaConf.to_yaml(config, resolve=False).replace(str(ROOT), REPOSITORY_PLACEHOLDER)


# -- a local run -------------------------------------------------------------------------------------------------


def local_run_record(work_dir: Path) -> dict[str, Any]:
    """Train :data:`LOCAL_RUN_OVERRIDES` in ``work_dir`` (run and model cache); return what ``local_run.json`` holds.

    Returns:
        ``{"overrides": [...], "environment": {name: value}, "records": [{"step": n, "data": {key: value}}]}``,
        the metrics without ``timing_s/*`` keys, floats rounded.
    """
    from dapo_verl.local.train import run

    run_dir = work_dir / "run"
    run([*LOCAL_RUN_OVERRIDES, f"local.cache_dir={work_dir / 'cache'}"], run_dir)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [
        {
            "step": record["step"],
            "data": {key: value for key, value in record["data"].items() if not key.startswith("timing_s/")},
        }
        for record in map(json.loads, lines)
    ]
    environment = json.loads((run_dir / "summary.json").read_text())["environment"]
    return plain({"overrides": list(LOCAL_RUN_OVERRIDES), "environment": environment, "records": records})


def local_run_difference(recorded: dict[str, Any], current: dict[str, Any]) -> str | None:
    """Where ``current``'s overrides or records first differ from ``recorded``'s beyond :data:`LOCAL_RUN_TOLERANCE`
    (None if nowhere); the environments are not compared."""
    for key in ("overrides", "records"):
        found = first_json_difference(
            recorded[key],
            current[key],
            path=f"[{key!r}]",
            rel_tol=LOCAL_RUN_TOLERANCE["rel"],
            abs_tol=LOCAL_RUN_TOLERANCE["abs"],
        )
        if found:
            return found
    return None


# -- rendering and comparing -------------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` as JSON-able data: floats rounded to :data:`SIGNIFICANT_DIGITS` digits, tuples as lists, dict keys
    as strings, a tensor as ``{"dtype", "shape", "values"}`` (``"sha256"`` of its bytes instead of ``"values"`` beyond
    :data:`MAX_TENSOR_VALUES`).

    Raises:
        TypeError: for a value of any other type.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        described: dict[str, Any] = {"dtype": str(tensor.dtype), "shape": list(tensor.shape)}
        if tensor.numel() > MAX_TENSOR_VALUES:
            described["sha256"] = hashlib.sha256(tensor.numpy().tobytes()).hexdigest()
        else:
            described["values"] = plain(tensor.tolist())
        return described
    raise TypeError(f"Cannot record a {type(value).__name__} ({value!r}); record plain data or tensors.")


def render_json(value: Any) -> str:
    """``value`` (plain data) as stable JSON text: keys sorted, one entry a line, a list of scalars on one line."""
    return _render(value, 0) + "\n"


def _render(value: Any, depth: int) -> str:
    pad, end = " " * (depth + 1), "\n" + " " * depth
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(key)}: {_render(value[key], depth + 1)}" for key in sorted(value)]
        return "{\n" + ",\n".join(items) + end + "}"
    if isinstance(value, list) and any(isinstance(item, dict | list) for item in value):
        return "[\n" + ",\n".join(pad + _render(item, depth + 1) for item in value) + end + "]"
    return json.dumps(value)


def first_json_difference(
    expected: Any, actual: Any, *, path: str = "", rel_tol: float = 0.0, abs_tol: float = 0.0
) -> str | None:
    """The first place where ``actual`` differs from ``expected`` (parsed JSON), as ``path: recorded ..., now ...``;
    None if nowhere. Numbers count as equal within ``max(rel_tol * |expected|, abs_tol)``, as ``pytest.approx``
    takes them."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            where = f"{path}[{key!r}]"
            if key not in actual or key not in expected:
                return f"{where}: {'recorded, now missing' if key not in actual else 'new, not recorded'}"
            found = first_json_difference(expected[key], actual[key], path=where, rel_tol=rel_tol, abs_tol=abs_tol)
            if found:
                return found
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        for index, (old, new) in enumerate(zip(expected, actual)):
            found = first_json_difference(old, new, path=f"{path}[{index}]", rel_tol=rel_tol, abs_tol=abs_tol)
            if found:
                return found
        if len(expected) != len(actual):
            return f"{path}: recorded {len(expected)} items, now {len(actual)}"
        return None
    if _is_number(expected) and _is_number(actual) and abs(expected - actual) <= max(rel_tol * abs(expected), abs_tol):
        return None
    if json.dumps(expected) == json.dumps(actual):  # also NaN against NaN
        return None
    return f"{path or 'the value'}: recorded {_short(expected)}, now {_short(actual)}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _short(value: Any, limit: int = 200) -> str:
    text = json.dumps(value)
    return text if len(text) <= limit else text[:limit] + "..."


def first_difference(name: str, recorded: str, current: str) -> str:
    """Where the fixture ``name``'s ``current`` text first differs from its ``recorded`` one: the JSON key path for
    a JSON fixture that still parses, else the first differing line."""
    if name.endswith(".json"):
        with contextlib.suppress(json.JSONDecodeError):  # a damaged file is located by its lines
            found = first_json_difference(json.loads(recorded), json.loads(current))
            if found:
                return found
    old_lines, new_lines = recorded.splitlines(), current.splitlines()
    for number, (old, new) in enumerate(zip(old_lines, new_lines), start=1):
        if old != new:
            return f"line {number}: recorded {old[:200]!r}, now {new[:200]!r}"
    return f"recorded {len(old_lines)} lines, now {len(new_lines)}"


# -- every fixture -----------------------------------------------------------------------------------------------


def fixture_producers() -> dict[str, Callable[[], str]]:
    """Every fixture but :data:`LOCAL_RUN`: its path under :data:`FIXTURE_DIR` and the function rendering it now."""
    producers: dict[str, Callable[[], str]] = {}
    producers.update({f"sampler/{run}.json": functools.partial(sampler_fixture, run) for run in SAMPLER_RUNS})
    producers.update({f"help/{name}.txt": functools.partial(help_fixture, name) for name in sorted(help_texts())})
    producers.update({f"recipes/{name}.yaml": functools.partial(recipe_fixture, name) for name in RECIPES})
    return producers


def recorded_files() -> set[str]:
    """The paths of the files under :data:`FIXTURE_DIR` (none when it does not exist)."""
    return {path.relative_to(FIXTURE_DIR).as_posix() for path in FIXTURE_DIR.rglob("*") if path.is_file()}


def write() -> None:
    """Regenerate every fixture, and delete those that no longer have a producer."""
    texts = {name: produce() for name, produce in fixture_producers().items()}
    with tempfile.TemporaryDirectory() as work_dir:
        texts[LOCAL_RUN] = render_json(local_run_record(Path(work_dir)))
    for name in sorted(recorded_files() - set(texts)):
        (FIXTURE_DIR / name).unlink()
        print(f"Deleted {name}")
    for name, text in texts.items():
        path = FIXTURE_DIR / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(
        f"Wrote {len(texts)} fixtures under {FIXTURE_DIR.relative_to(ROOT)}/ "
        f"({sum(len(text.encode()) for text in texts.values()) / 1024:.0f} KiB)."
    )


def check() -> list[str]:
    """One line for each fixture that differs from today's behaviour, is missing or has no producer."""
    recorded, producers = recorded_files(), fixture_producers()
    problems = [
        f"{name}: recorded, but nothing produces it any more"
        for name in sorted(recorded - set(producers) - {LOCAL_RUN})
    ]
    for name, produce in producers.items():
        if name not in recorded:
            problems.append(f"{name}: not recorded")
        elif (text := (FIXTURE_DIR / name).read_text()) != (current := produce()):
            problems.append(f"{name}: {first_difference(name, text, current)}")
    if LOCAL_RUN not in recorded:
        return [*problems, f"{LOCAL_RUN}: not recorded"]
    with tempfile.TemporaryDirectory() as work_dir:
        current_run = local_run_record(Path(work_dir))
    found = local_run_difference(json.loads((FIXTURE_DIR / LOCAL_RUN).read_text()), current_run)
    return [*problems, f"{LOCAL_RUN}: {found}"] if found else problems


def main(argv: Sequence[str] | None = None) -> int:
    """``--write`` regenerates the fixtures; ``--check`` returns 1 and names each one that differs."""
    parser = argparse.ArgumentParser(prog="python -m tools.record_behaviour", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate every fixture under tests/data/behaviour/")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each fixture that differs")
    args = parser.parse_args(argv)
    if args.write:
        write()
        return 0
    problems = check()
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} fixture(s) differ from today's behaviour: {WRITE_HINT}.")
        return 1
    print(f"Every fixture under {FIXTURE_DIR.relative_to(ROOT)}/ matches today's behaviour.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
