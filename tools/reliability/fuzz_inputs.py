"""Fuzz targets of what dapo_verl reads from outside: config values, and the sampler's callback and state contracts.

* config values: drawn values at random keys of the DAPO config (:meth:`~dapo_verl.config.DapoConfig.from_verl`)
  and of the local backend's (``dapo-verl train``'s own keys); an accepted value must read back unchanged;
* the sampler's contracts: :class:`~dapo_verl.sampler.BatchReplenisher` with faulty ``generate`` callbacks, and
  fed damaged states (:mod:`dapo_verl.sampler.contracts`); a fault must be refused naming it, and a refused
  state must leave the sampler as it was.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from dapo_verl import core
from dapo_verl.config import iter_verl_fields
from tools.reliability.fuzz_cases import Case, names_exactly

__all__ = ["config_case_for", "local_root", "local_run_tree", "read_local", "sampler_case", "sampler_state_case"]


# -- config ---------------------------------------------------------------------------------------------

_CONFIG_VALUES = [
    -1,
    0,
    1,
    1.5,
    -0.5,
    0.2,
    2**40,
    "x",
    "",
    "false",
    "true",
    True,
    False,
    None,
    [],
    {"a": 1},
    math.nan,
    math.inf,
]


def _fits_type(value: Any, annotation: str) -> bool:
    """Whether an accepted non-None ``value`` has the type the field's annotation (``"int | None"``, ...) names."""
    if "bool" in annotation:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if "float" in annotation:
        return isinstance(value, int | float) and math.isfinite(value)
    if "int" in annotation:
        return isinstance(value, int)
    return isinstance(value, str) and bool(value)


def _read_back(config: Any, attr_path: tuple[str, ...]) -> Any:
    for part in attr_path:
        config = getattr(config, part)
    return config


def config_case_for(
    read: Callable[[Mapping[str, Any]], Any], root: type, tree: Callable[[], dict[str, Any]]
) -> Callable[[Case], Callable[[], Any]]:
    """A config target: inject drawn values at random keys of ``tree()`` and read it with ``read``."""
    leaves = {key: leaf for key, leaf in iter_verl_fields(root)}

    def make(case: Case) -> Callable[[], Any]:
        config = tree()
        injected: dict[str, Any] = {}
        for _ in range(case.rng.randint(1, 3)):
            key = case.rng.choice(sorted(leaves))
            node = config
            *parents, name = key.split(".")
            for part in parents:
                node = node[part]
            node[name] = injected[key] = case.rng.choice(_CONFIG_VALUES)
            case.note(f"{key}={injected[key]!r}")
        case.risky |= set(injected)  # the oracle below decides: read back exactly, or refused naming a key

        def run() -> None:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", DeprecationWarning)
                result = read(config)
            deprecated = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
            for key, value in injected.items():
                if any(names_exactly(message, key) for message in deprecated):
                    continue  # a deprecated key: ignored, and the user was told so
                leaf = leaves[key]
                got = _read_back(result, leaf.attr_path)
                if value is None:
                    assert got == leaf.default, f"{key}=None read back as {got!r}, not the default"
                    continue
                annotation = str(leaf.field.type)
                assert _fits_type(value, annotation), f"{key}={value!r} accepted for a field of type {annotation}"
                assert got == value and type(got) is type(value), f"{key}={value!r} read back as {got!r}"

        return run

    return make


def local_run_tree() -> dict[str, Any]:
    from dapo_verl.local.config import LocalRunConfig, defaults_tree

    return defaults_tree(LocalRunConfig)


def read_local(tree: Mapping[str, Any]) -> Any:
    from dapo_verl.local.config import read_run_config

    return read_run_config(tree)


def local_root() -> type:
    from dapo_verl.local.config import LocalRunConfig

    return LocalRunConfig


# -- sampler -------------------------------------------------------------------------------------------


_GENERATE_FAULTS = {
    # fault -> the names an error may use for it (the callback, the group or its field)
    "count": {"generate"},
    "order": {"prompt"},
    "singleton": {"metric"},
    "shape": {"response_lengths"},
    "nan": {"metric"},
    "none_returned": {"generate"},
    "not_a_group": {"generate"},
    "list_metric": {"metric"},
    "negative_length": {"response_lengths"},
    "float_length": {"response_lengths"},
    "truncated_2": {"truncated"},
    "scores_shape": {"scores"},
    "scores_nan": {"scores"},
    "str_prompt_id": {"prompt"},
    "meta_metric": {"metric"},
    "complex_scores": {"scores"},
}


def _faulty_groups(case: Case, ids: Any, fault: str, size: int) -> Any:
    """What a generate callback with ``fault`` returns for ``ids`` ("none": a correct result)."""
    from dapo_verl.sampler import GroupResult

    if fault == "none_returned":
        return None
    groups: list[Any] = []
    for pid in ids:
        g = 1 if fault == "singleton" else size
        metric: Any = torch.rand(g, generator=case.gen) < 0.5
        lengths = torch.randint(1, 9, (g + (1 if fault == "shape" else 0),), generator=case.gen)
        truncated = torch.zeros(lengths.shape, dtype=torch.int64 if fault == "truncated_2" else torch.bool)
        scores = metric.float() if fault not in ("scores_shape", "scores_nan") else torch.zeros(g + 1)
        if fault == "scores_nan":
            scores = torch.full((g,), math.nan)
        if fault == "nan":
            metric = metric.float()
            metric[0] = math.nan
        if fault in ("negative_length", "float_length"):
            lengths = -lengths if fault == "negative_length" else lengths + 0.5
        if fault == "truncated_2":
            truncated[0] = 2
        if fault in ("meta_metric", "complex_scores"):
            metric, scores = (
                (torch.empty(g, device="meta"), scores)
                if fault == "meta_metric"
                else (metric, scores.to(torch.complex64))
            )
        metric = metric.tolist() if fault == "list_metric" else metric
        prompt = str(pid) if fault == "str_prompt_id" else pid + (1 if fault == "order" else 0)
        group = GroupResult(prompt, metric, lengths, truncated, scores=scores)
        groups.append({"prompt_id": pid} if fault == "not_a_group" else group)
    return groups[:-1] if fault == "count" else groups


def sampler_case(case: Case) -> Callable[[], Any]:
    """BatchReplenisher driven by a generate callback that breaks its contract half of the time."""
    from dapo_verl.config import SamplerConfig
    from dapo_verl.sampler import BatchReplenisher, ShortfallError

    config = SamplerConfig(
        train_batch_size=case.rng.randint(1, 6),
        max_num_gen_batches=case.rng.randint(1, 4),
        refill=case.rng.choice(["barrier", "adaptive"]),
        surplus=case.rng.choice(["discard", "carry"]),
        on_shortfall=case.rng.choice(["error", "partial"]),
        seed=case.rng.randrange(1000),
    )
    fault = case.pick("generate", ["none"], bad=sorted(_GENERATE_FAULTS), p_bad=0.5)
    case.bad |= _GENERATE_FAULTS.get(fault, set())  # the fault may be reported under its field
    size = case.rng.choice([2, 4])
    case.note(f"{config} fault={fault}")

    def run() -> None:
        sampler = BatchReplenisher(config, case.rng.randint(1, 20), lambda ids: _faulty_groups(case, ids, fault, size))
        for _ in range(3):
            try:
                batch = sampler.next_batch()
            except ShortfallError:  # the configured policy, with its message: a correct outcome
                assert config.on_shortfall == "error"
            else:
                assert len(batch.groups) == config.train_batch_size or batch.is_partial
                assert batch.groups == [] or bool(core.dynamic_group_mask(batch.stacked_metric()).all())
            assert sampler.conservation_gap() == 0

    return run


_REQUIRED_STREAM_KEYS = ["epoch", "num_prompts", "position", "prompts_consumed", "prompts_skipped", "rng"]
"""Keys of a prompt stream's state its reader needs (the others have defaults for older states)."""


def _damaged_state(case: Case, state: dict[str, Any]) -> tuple[Any, set[str]]:
    """``state`` damaged one way, and the names an error may use for the damage (empty: not damaged)."""
    how = case.pick(
        "state",
        ["intact"],
        bad=[
            "not_a_mapping",
            "version",
            "drop_part",
            "wrong_type",
            "stream_key",
            "carried_item",
            "prompt_count",
            "negative_count",
        ],
        p_bad=0.6,
    )
    part = case.rng.choice(["counters", "dropped", "keep_rate_estimate", "stream", "carried"])
    case.note(f"state damage={how} part={part}")
    if how == "not_a_mapping":
        return case.rng.choice([None, [], "state", 3]), {"state"}
    if how == "version":
        return {**state, "version": case.rng.choice([None, 99, "2"])}, {"version"}
    if how == "drop_part":
        return {k: v for k, v in state.items() if k != part}, {part}
    if how == "wrong_type":
        return {**state, part: "x"}, {part}
    if how == "stream_key":
        key = case.rng.choice(_REQUIRED_STREAM_KEYS)
        return {**state, "stream": {k: v for k, v in state["stream"].items() if k != key}}, {key, "stream"}
    if how == "carried_item":
        return {**state, "carried": [{"prompt_id": 1}]}, {"carried"}
    if how == "negative_count":  # a count below 0 would break the conservation check and every rate
        key = case.rng.choice(["counters", "dropped", "stream"])
        field = {"counters": "groups_generated", "dropped": "all_wrong", "stream": "prompts_consumed"}[key]
        return {**state, key: {**state[key], field: -case.rng.randint(1, 5)}}, {field, key}
    if how == "prompt_count":
        return {**state, "stream": {**state["stream"], "num_prompts": state["stream"]["num_prompts"] + 1}}, {"state"}
    return state, set()


def sampler_state_case(case: Case) -> Callable[[], Any]:
    """BatchReplenisher.load_state_dict given a saved state, intact or damaged: refused naming what is wrong, and
    the sampler unchanged by a refused load."""
    from dapo_verl.config import SamplerConfig
    from dapo_verl.sampler import BatchReplenisher
    from dapo_verl.sampler.simulation import SimulatedPolicy

    config = SamplerConfig(
        train_batch_size=case.rng.randint(1, 4),
        surplus=case.rng.choice(["discard", "carry"]),
        on_shortfall="partial",
        seed=case.rng.randrange(1000),
    )
    prompts = case.rng.randint(4, 16)
    source = BatchReplenisher(config, prompts, SimulatedPolicy(lambda i, step: 0.5, group_size=4, seed=0))
    for _ in range(case.rng.randint(0, 2)):
        source.next_batch()
    state, names = _damaged_state(case, source.state_dict())
    case.bad |= names

    def run() -> None:
        target = BatchReplenisher(config, prompts, SimulatedPolicy(lambda i, step: 0.5, group_size=4, seed=1))
        before = json.dumps(target.state_dict(), default=str, sort_keys=True)
        try:
            target.load_state_dict(state)
        except (ValueError, TypeError):
            assert json.dumps(target.state_dict(), default=str, sort_keys=True) == before, "left half-restored"
            raise
        assert target.train_steps == source.train_steps and target.conservation_gap() == 0
        target.next_batch()

    return run
