"""``dapo-verl rehearse``: run a recipe through verl's real trainer on this machine, then resume it.

A rehearsal composes the recipe exactly as the cluster launcher does (Hydra, with the user's overrides),
shrinks only scale, hardware and engine keys (:mod:`.plan`, printed before anything starts), prepares data
(:mod:`.data`) and a model (:mod:`.stand_in`), and starts the recipe's own entry point --
``python -m dapo_verl.main --config-name <recipe>``, or ``python -m verl.trainer.main_ppo`` for verl's
``ppo_trainer`` -- in a subprocess with:

* ``VERL_PLATFORM=cpu`` and ``VERL_USE_EXTERNAL_MODULES=dapo_verl.rehearsal.bridges.cpu_plugin`` (every process of the
  run loads the CPU platform and rollout replica; nothing outside the rehearsal does);
* a private Ray cluster in a temporary directory, which the run starts and stops;
* ``VERL_FILE_LOGGER_PATH`` pointing at the run's ``metrics.jsonl``;
* the run's record folder (``runN/engine``: which vLLM ran, the weight-sync probe, the shared memory its
  processes created) and, with vLLM, the private folder of :mod:`.engine`'s bridges first on ``PYTHONPATH``.

The rollout engine is verl's own vLLM rollout whenever vLLM's CPU build is installed, else the stand-in replica
(:func:`.engine.choose_engine`; ``--engine`` chooses). After each run the rehearsal removes the shared-memory
segments and semaphores that run's processes recorded and left behind, and only those.

The first run trains ``steps`` steps with a checkpoint before the last one; the second run resumes from that
checkpoint and trains the last step again, skipping the validation before training that the first run already did
(:mod:`.schedule` starts them -- one after the other, or with ``overlap`` together -- and samples their memory;
:mod:`.processes` launches each and follows it). :mod:`.report` compares the two and summarises what verl logged.
A stop signal stops both runs; the report is written, and :class:`RehearsalInterrupted` says what was stopped.

With ``nodes`` >= 2 the two runs are instead Ray jobs that ``recipes/run_ray.sh --follow`` submits to a private
multi-node cluster on this machine (:mod:`.cluster`, :mod:`.multinode`), and the report adds what the cluster says
of them.

Output layout under ``out``: ``data/`` (train/val parquet), ``model/`` (the stand-in), ``run1/`` and
``run2/`` (``metrics.jsonl``, ``log.txt``, ``checkpoints/``, ``engine/``), ``changes.json``, ``report.md``,
``report.json``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from dapo_verl.rehearsal.data import RehearsalData, prepare_files
from dapo_verl.rehearsal.engine import (
    VLLM_ENVIRONMENT,
    Engine,
    EngineChoice,
    EngineUnavailable,
    choose_engine,
    vllm_environment,
    write_private_site,
)
from dapo_verl.rehearsal.folders import RehearsalError, own_out, private_folders
from dapo_verl.rehearsal.options import RehearsalInterrupted, RehearsalOptions, RehearsalResult
from dapo_verl.rehearsal.plan import Change, RehearsalShape, override_keys, rehearsal_changes, select
from dapo_verl.rehearsal.recipe import VERL_CONFIG, compose_recipe, recipe_summary
from dapo_verl.rehearsal.schedule import Outcome, Target, run_both

__all__ = [
    "RehearsalError",
    "RehearsalInterrupted",
    "RehearsalOptions",
    "RehearsalResult",
    "compose_recipe",
    "rehearse",
]

MAX_OWN_MODEL_PARAMETERS = 30_000_000
"""A recipe's ``model.path`` is rehearsed as is when it is a local model up to this size; else the stand-in."""


def _as_list(value: Any) -> list[str] | None:
    if value is None or (isinstance(value, str) and value.startswith("<unresolved")):
        return None
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _small_local_model(path: Any) -> bool:
    """Whether ``path`` is a local Hugging Face model of at most :data:`MAX_OWN_MODEL_PARAMETERS` parameters."""
    if not isinstance(path, str) or not (Path(path) / "config.json").is_file():
        return False
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()) <= MAX_OWN_MODEL_PARAMETERS


def _longest_prompt(model_path: str, files: Sequence[Path], prompt_key: str) -> int | None:
    """Longest chat-templated prompt of ``files`` in tokens, or None if the files lack ``prompt_key``."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    longest = 0
    for file in files:
        table = pq.read_table(file)
        if prompt_key not in table.column_names:
            return None
        for messages in table.column(prompt_key).to_pylist():
            if isinstance(messages, str):
                messages = [{"role": "user", "content": messages}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            longest = max(longest, len(tokenizer(text)["input_ids"]))
    return longest


def _max_positions(model_path: str) -> int | None:
    """The model's ``max_position_embeddings`` from its ``config.json`` (None when absent)."""
    value = json.loads((Path(model_path) / "config.json").read_text()).get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _plan(
    options: RehearsalOptions,
    config: DictConfig,
    out: Path,
    run: str,
    ray_dir: str,
    data: RehearsalData,
    model_path: str,
    replaced: bool,
    engine: Engine,
) -> list[Change]:
    prompt_key = select(config, "data.prompt_key", "prompt")
    longest = _longest_prompt(model_path, [data.train_file, data.val_file], prompt_key) or 448
    shape = RehearsalShape(
        model_path=model_path,
        model_replaced=replaced,
        train_file=str(data.train_file),
        val_file=str(data.val_file),
        max_prompt_length=64 * -(-longest // 64),
        max_response_length=options.max_response_length,
        train_batch_size=options.train_batch_size,
        gpus=options.gpus,
        steps=options.steps,
        checkpoint_dir=str(out / run / "checkpoints"),
        ray_temp_dir=ray_dir,
        engine=engine.value,
        max_positions=_max_positions(model_path),
        nodes=options.nodes,
    )
    return rehearsal_changes(config, shape, override_keys(options.overrides))


def _check(options: RehearsalOptions) -> None:
    if options.nodes < 1:
        raise RehearsalError(
            f"--nodes {options.nodes}: need >= 1 Ray node (1: one process tree; 2 or more: a "
            f"multi-node cluster on this machine)."
        )
    if options.nodes > 1 and options.overlap:
        raise RehearsalError(
            f"--nodes {options.nodes} with --overlap-resume: the runs of a multi-node rehearsal are "
            f"jobs on one cluster, one after the other; drop --overlap-resume."
        )
    if options.overlap and not options.resume:
        raise RehearsalError(
            "--overlap-resume with --no-resume: there is no resume run to start with the first; drop one of them."
        )
    if options.nodes > 1 and options.config_name == VERL_CONFIG:
        raise RehearsalError(
            f"--nodes {options.nodes} rehearses through recipes/run_ray.sh, which submits "
            f"dapo_verl's recipes (python -m dapo_verl.main); rehearse one of them, or "
            f"{VERL_CONFIG} on one node."
        )
    if options.steps < 2:
        raise RehearsalError(
            f"--steps {options.steps}: a rehearsal needs >= 2 steps (a checkpoint at step "
            f"steps-1 is resumed). Use --steps 2 or more."
        )
    if options.gpus < 1:
        raise RehearsalError(f"--gpus {options.gpus}: need >= 1 worker process.")
    if options.train_batch_size < 1 or options.max_response_length < 1:
        raise RehearsalError("--train-batch-size and --max-response-length must be >= 1.")


_HELD_GIB = {Engine.STAND_IN: (4.0, 0.8), Engine.VLLM: (7.0, 2.5)}
"""Per engine, a lower bound of the memory one run holds (GiB, sum of PSS): with one data-parallel rank, and for
each further rank; below the measurements in docs/rehearse.md, Memory."""
_NODE_GIB = 0.8
"""A lower bound of what each further Ray node's daemons hold (GiB), from the same measurements."""


def _check_memory(options: RehearsalOptions, engine: Engine) -> None:
    """Refuse a rehearsal whose ranks cannot fit in this machine's memory even at the measured lower bound, before
    anything starts (a hundred Ray nodes would start for minutes and then be killed for lack of memory)."""
    first, more = _HELD_GIB[engine]
    runs = 2 if options.overlap else 1  # --overlap-resume holds both runs at once

    def need(ranks: int, nodes: int) -> float:
        return runs * (first + more * (ranks - 1)) + _NODE_GIB * (nodes - 1)

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    ranks = options.nodes * options.gpus
    if need(ranks, options.nodes) <= total:
        return
    fits = max((n for n in range(1, ranks) if need(n, 1) <= total), default=0)
    twice = ", twice over with --overlap-resume" if runs == 2 else ""
    raise RehearsalError(
        f"--nodes {options.nodes} --gpus {options.gpus}: {ranks} data-parallel rank(s) on the {engine.value} engine "
        f"hold at least {need(ranks, options.nodes):.0f} GiB (measured: {first:g} GiB for one rank, {more:g} GiB "
        f"more for each further rank, {_NODE_GIB:g} GiB for each further Ray node{twice}; docs/rehearse.md, "
        f"Memory), and this machine has {total:.1f} GiB. Rehearse with at most {fits} rank(s) here: the code path is "
        f"the same with fewer."
    )


def _check_length_options(config: DictConfig, engine: str) -> None:
    """Refuse the stand-in's length options (``engine_kwargs.dapo_cpu``) here, not inside a started engine.

    On vLLM, ``long_tail`` needs temperature 1: it masks EOS before the drawn length, so the rollout reports vLLM's
    raw log-probabilities (the planner sets ``logprobs_mode``), which leave out the temperature.
    """
    from dapo_verl.preflight import ConfigRefused, Problem
    from dapo_verl.rehearsal.bridges.response_lengths import OPTIONS_ENGINE, length_shape

    key = f"actor_rollout_ref.rollout.engine_kwargs.{OPTIONS_ENGINE}"
    rollout = config.actor_rollout_ref.rollout
    try:
        shape = length_shape(rollout)
    except ValueError as err:
        raise ConfigRefused([Problem(key, str(err))]) from None
    temperature = select(config, "actor_rollout_ref.rollout.temperature")
    if shape is not None and engine == "vllm" and temperature != 1.0:
        raise ConfigRefused(
            [
                Problem(
                    key,
                    f"{key}.response_lengths=long_tail on vLLM needs actor_rollout_ref."
                    f"rollout.temperature=1.0, not {temperature!r}: it masks EOS before the "
                    f"drawn length, so the rollout reports vLLM's raw log-probabilities, which "
                    f"leave out the temperature. Rehearse at temperature 1.0, or with --engine "
                    f"stand-in.",
                )
            ]
        )


def rehearse(options: RehearsalOptions, echo: Callable[[str], None] = print) -> RehearsalResult:
    """Run the rehearsal described in the module docstring and return what happened (see :mod:`.report`).

    The report (``report.json``, ``report.md``) is written before the folder's lock is released and is also in
    the result's ``report``.

    Raises:
        RehearsalInterrupted: after a stop signal (Ctrl-C, SIGTERM, SIGHUP) stopped the runs; the report is written.
        RehearsalError: when the rehearsal cannot start (unknown config, bad options, unusable ``--out``, a
            rehearsal still running in ``--out``). A failing verl run does not raise: its error is in the result and
            the report.
        dapo_verl.preflight.ConfigRefused: for a config a run would refuse (one problem each), before anything
            is written.
    """
    from dapo_verl.adapter.preflight import check_verl_config

    _check(options)
    try:
        engine = choose_engine(options.engine)
    except (ValueError, EngineUnavailable) as err:
        raise RehearsalError(str(err)) from None
    _check_memory(options, engine.engine)
    config, entry = compose_recipe(options.config_name, options.overrides)
    check_verl_config(config, entry_module=entry[2], unset_env_is_problem=False)  # the recipe's paths are replaced
    _check_length_options(config, engine.engine)
    if options.nodes > 1 and select(config, "trainer.v1.trainer_mode") == "separate_async":
        raise RehearsalError(
            f"--nodes {options.nodes}: trainer.v1.trainer_mode=separate_async places its rollout "
            f"pool on nodes of its own, which a multi-node rehearsal does not set up yet; rehearse it "
            f"on one node."
        )
    out = options.out_dir.resolve()
    with own_out(out, options.overwrite):
        result = _rehearse_in(out, options, config, entry, engine, echo)
        from dapo_verl.rehearsal.report import write_report

        result.report = write_report(result)  # inside the lock: the folder has one writer until its report is out
    if result.interrupted_by:
        raise RehearsalInterrupted(result)
    return result


def _rehearse_in(
    out: Path,
    options: RehearsalOptions,
    config: DictConfig,
    entry: list[str],
    engine: EngineChoice,
    echo: Callable[[str], None],
) -> RehearsalResult:
    """The rehearsal's body, in the folder ``out`` that :func:`.folders.own_out` made its own."""
    from dapo_verl.rehearsal.stand_in import build_stand_in

    own_model = select(config, "actor_rollout_ref.model.path")
    replaced = not _small_local_model(own_model)
    model_path = str(build_stand_in(out / "model", seed=options.seed)) if replaced else str(own_model)
    data = prepare_files(
        out / "data",
        train_files=_as_list(select(config, "data.train_files")),
        val_files=_as_list(select(config, "data.val_files")),
        train_rows=options.train_rows,
        val_rows=options.val_rows,
        seed=options.seed,
    )
    with private_folders(out, cluster=options.nodes > 1) as (ray_dirs, site):
        changes = _plan(options, config, out, "run1", ray_dirs[0], data, model_path, replaced, engine.engine)
        environment = dict(VLLM_ENVIRONMENT) if engine.engine is Engine.VLLM else {}
        result = RehearsalResult(
            options,
            " ".join(entry[1:]),
            entry[2],
            changes,
            data,
            model_path,
            replaced,
            engine,
            environment,
            recipe=recipe_summary(config),
        )
        (out / "changes.json").write_text(json.dumps([asdict(c) for c in changes], indent=1, default=str))
        echo(_changes_text(options, entry, changes, engine, environment))

        def engine_env(ray_dir: str) -> dict[str, str]:
            if engine.engine is not Engine.VLLM:
                return {}
            return vllm_environment(write_private_site(site, str(engine.version)), ray_dir)

        if options.nodes == 1:
            target = Target(entry, lambda run: out / run / "checkpoints", lambda run, ray_dir: engine_env(ray_dir))
            outcome = run_both(options, target, changes, out, ray_dirs, echo)
        else:
            outcome = _on_cluster(
                options, config, out, changes, ray_dirs, engine_env(ray_dirs[2]), model_path, data, result, echo
            )
    result.runs, result.not_started, result.interrupted_by = outcome.runs, outcome.not_started, outcome.interrupted_by
    result.memory = outcome.memory
    return result


def _on_cluster(
    options: RehearsalOptions,
    config: DictConfig,
    out: Path,
    changes: list[Change],
    ray_dirs: list[str],
    engine_env: dict[str, str],
    model_path: str,
    data: RehearsalData,
    result: RehearsalResult,
    echo: Callable[[str], None],
) -> Outcome:
    """The runs as jobs on a cluster of ``options.nodes`` nodes (:mod:`.multinode`); the cluster's account of them
    goes into ``result.cluster``."""
    from dapo_verl.rehearsal.cluster import ClusterError, LocalCluster
    from dapo_verl.rehearsal.multinode import job_report, job_target, node_env

    cluster = LocalCluster(options.nodes, options.gpus, ray_dirs[2], out / "cluster", node_env(engine_env), echo=echo)
    try:
        with cluster:
            recipe_checkpoints = "trainer.default_local_dir" not in {change.key for change in changes}
            target = job_target(
                config, options.config_name, out, cluster, model_path, data.train_file.parent, recipe_checkpoints
            )
            outcome = run_both(options, target, changes, out, ray_dirs[:2], echo)
            result.cluster = job_report(cluster, out, [run.log.parent.name for run in outcome.runs])
    except ClusterError as err:
        raise RehearsalError(str(err)) from None
    return outcome


def _changes_text(
    options: RehearsalOptions,
    entry: list[str],
    changes: list[Change],
    engine: EngineChoice,
    environment: dict[str, tuple[str, str]],
) -> str:
    lines = [
        f"Rehearsing {options.config_name} through `{' '.join(entry[1:])}` on this machine.",
        f"Rollout engine: {engine.label} ({engine.reason}).",
        f"Keys changed for a CPU run ({len(changes)}; everything else is the recipe's own):",
    ]
    width = max((len(c.key) for c in changes), default=0)
    for group in ("model", "scale", "hardware", "engine", "run"):
        for change in (c for c in changes if c.group == group):
            recipe = "(unset)" if change.recipe is None else change.recipe
            lines.append(f"  {change.key:<{width}}  {recipe} -> {change.rehearsal}   ({group}: {change.reason})")
    if environment:
        lines.append("Environment of the run's processes:")
        lines += [f"  {name}={value}   ({reason})" for name, (value, reason) in environment.items()]
    return "\n".join(lines)
