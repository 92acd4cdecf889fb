"""A rehearsal's changes to a recipe as data: one :class:`Change` per key, the :class:`RehearsalShape` the run
shrinks to, and the :class:`Planner` that records the changes :mod:`.plan` decides, reading values with
:func:`select` (which names an unresolvable ``${oc.env:...}`` instead of failing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["Change", "Planner", "RehearsalShape", "declared", "select"]

_MISSING = object()


@dataclass(frozen=True)
class Change:
    """One key the rehearsal sets.

    Attributes:
        key: Full dotted verl key.
        recipe: The recipe's value (``None`` when unset, ``"<unresolved: ...>"`` when it names a missing
            environment variable).
        rehearsal: The value the rehearsal runs with.
        reason: Why, in a few words.
        group: ``model``, ``scale``, ``hardware``, ``engine`` or ``run``.
        declared: Whether the key exists in the composed config (otherwise it is added with ``+``).
    """

    key: str
    recipe: Any
    rehearsal: Any
    reason: str
    group: str
    declared: bool = True

    def override(self) -> str:
        """The Hydra command-line override that applies this change."""
        value = self.rehearsal
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif value is None:
            text = "null"
        elif isinstance(value, (list, tuple)):
            text = "[" + ",".join(str(v) for v in value) + "]"
        elif isinstance(value, dict):
            text = "{" + ",".join(f"{k}:{v}" for k, v in value.items()) + "}"
        else:
            text = str(value)
        return f"{'' if self.declared else '+'}{self.key}={text}"


@dataclass(frozen=True)
class RehearsalShape:
    """The sizes the rehearsal runs at (chosen by :mod:`.run` from the data and the command line).

    Attributes:
        model_path: The stand-in model (or the recipe's own small model).
        model_replaced: Whether ``model_path`` replaces the recipe's model.
        train_file: Rehearsal training parquet file.
        val_file: Rehearsal validation parquet file.
        max_prompt_length: Longest rehearsal prompt in tokens, rounded up (never above the recipe's).
        max_response_length: Response budget in tokens.
        train_batch_size: Prompt groups per training step.
        gpus: Fake GPUs (CPU worker processes) on each node.
        steps: Training steps of the first run.
        checkpoint_dir: ``trainer.default_local_dir`` of the run.
        ray_temp_dir: The private Ray directory of the run (a short path: Ray's socket names must fit 107 bytes).
        engine: ``vllm`` (verl's own vLLM rollout on vLLM's CPU build) or ``stand-in`` (the CPU replica).
        max_positions: The model's ``max_position_embeddings`` (None when its config does not say).
        nodes: Ray nodes. With more than one the runs are jobs on a running cluster (:mod:`.multinode`): Ray's
            start-up keys stay the recipe's, and so do its checkpoint and log paths under ``DAPO_OUTPUT_DIR``.
    """

    model_path: str
    model_replaced: bool
    train_file: str
    val_file: str
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    gpus: int
    steps: int
    checkpoint_dir: str
    ray_temp_dir: str
    engine: str = "stand-in"
    max_positions: int | None = None
    nodes: int = 1


def select(config: DictConfig, key: str, default: Any = None) -> Any:
    """``config``'s value at ``key``; ``"<unresolved: ...>"`` for an interpolation that cannot resolve here."""
    try:
        value = OmegaConf.select(config, key, default=_MISSING, throw_on_resolution_failure=True)
    except Exception as err:  # an ${oc.env:...} the cluster sets and this machine does not
        variable = re.search(r"Environment variable '(\w+)' not found", str(err))
        return f"<unresolved: ${variable.group(1)} is not set>" if variable else f"<unresolved: {err}>".splitlines()[0]
    if value is _MISSING:
        return default
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value


def declared(config: DictConfig, key: str) -> bool:
    """Whether ``key`` exists in ``config`` (an override of an undeclared key needs Hydra's ``+``)."""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent, throw_on_resolution_failure=False) if parent else config
    return isinstance(node, DictConfig) and leaf in node


class Planner:
    """Records the changes of one plan: a key is set unless the recipe already has the value or the user gave it."""

    def __init__(self, config: DictConfig, user_keys: frozenset[str]) -> None:
        self.config = config
        self.user_keys = user_keys
        self.changes: dict[str, Change] = {}

    def set(
        self,
        key: str,
        value: Any,
        reason: str,
        group: str,
        *,
        only_if_declared: bool = False,
        user_wins: bool = False,
        keep_given: bool = True,
    ) -> None:
        exists = declared(self.config, key)
        given = keep_given and (group == "scale" or user_wins) and key in self.user_keys
        if (only_if_declared and not exists) or given:
            return
        recipe = select(self.config, key)
        if exists and recipe == value:
            return
        self.changes[key] = Change(key, recipe, value, reason, group, exists)

    def get(self, key: str, default: Any = None) -> Any:
        value = select(self.config, key, default)
        return default if isinstance(value, str) and value.startswith("<unresolved") else value
