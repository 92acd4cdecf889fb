"""Fuzz target of the pre-flight check: the Hydra overrides a user gives ``dapo-verl doctor`` or ``rehearse``.

Each case composes a shipped config (``dapo_trainer`` or the paper recipe) with one to three overrides of
distinct keys, each drawn valid or invalid, through the path ``doctor`` and ``rehearse`` take
(:func:`~dapo_verl.rehearsal.run.compose_recipe`, then :func:`~dapo_verl.adapter.preflight.compose_and_check`).
Invalid draws are those a run refuses at start-up: a misspelt key (plain or added with ``+``), a deletion
(``~key``), a name verl's registries do not hold, a value out of range, a group of one response, broken override
grammar. Every invalid override must be refused naming its key; a config of valid overrides only must pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tools.reliability.fuzz_cases import Case

__all__ = ["preflight_case"]

_CONFIGS = ("dapo_trainer", "dapo_qwen2.5_32b")

_KEYS: dict[str, tuple[list[str], list[str]]] = {
    # key -> (valid values, invalid values: each refused at start-up)
    "actor_rollout_ref.actor.clip_ratio_high": (["0.2", "0.28", "0.3"], ["-0.1", "abc"]),
    "actor_rollout_ref.actor.clip_ratio_low": (["0.1", "0.2"], ["3", "-1"]),
    "actor_rollout_ref.actor.loss_agg_mode": (["token-mean", "seq-mean-token-mean"], ["token_mean", "mean"]),
    "actor_rollout_ref.actor.policy_loss.loss_mode": (["dapo", "vanilla"], ["dapoo", "DAPO", "grpo"]),
    "actor_rollout_ref.rollout.n": (["4", "8", "16"], ["1", "0", "-2"]),
    "actor_rollout_ref.rollout.name": (["vllm", "sglang"], ["vlm", "hf"]),
    "algorithm.adv_estimator": (["dapo", "grpo"], ["grpoo", "remax"]),
    "algorithm.filter_groups.metric": (["acc"], ["accuracy", "correct"]),
    "algorithm.filter_groups.refill": (["barrier", "adaptive"], ["adaptiv", "fixed"]),
    "algorithm.filter_groups.surplus": (["discard", "carry"], ["keep"]),
    "algorithm.filter_groups.max_num_gen_batches": (["1", "10"], ["0", "-3"]),
    "data.train_batch_size": (["64", "512"], ["0", "abc"]),
    "reward.reward_manager.name": (["dapo_verl"], ["dapo-verl", "dapo_verll"]),
    "reward.reward_kwargs.overlong_tokens": (["1024", "4096"], ["0", "100000000"]),
    "trainer.v1.trainer_mode": (["sync", "colocate_async"], ["colocate", "async"]),
}


def _typo(case: Case, key: str) -> str:
    """``key`` with its last part misspelt one way (a dropped, doubled or swapped letter)."""
    head, _, leaf = key.rpartition(".")
    if len(leaf) < 3:
        return f"{head}.{leaf}{leaf[-1]}"
    i = case.rng.randrange(1, len(leaf) - 1)
    how = case.rng.choice(["drop", "double", "swap"])
    leaf = {
        "drop": leaf[:i] + leaf[i + 1 :],
        "double": leaf[:i] + leaf[i] + leaf[i:],
        "swap": leaf[: i - 1] + leaf[i] + leaf[i - 1] + leaf[i + 1 :],
    }[how]
    return f"{head}.{leaf}"


def _override(case: Case, key: str) -> str:
    """One override of ``key``: valid, or (drawn invalid) a bad value, a misspelt key, a deletion, bad grammar."""
    good, bad = _KEYS[key]
    if not case.chance(0.5):
        return f"{key}={case.rng.choice(good)}"
    case.bad.add(key)
    how = case.rng.choice(["value", "value", "typo", "added_typo", "deletion", "grammar"])
    if how in ("typo", "added_typo"):
        misspelt = _typo(case, key)
        case.bad.discard(key)
        case.bad.add(misspelt)
        return f"{'+' if how == 'added_typo' else ''}{misspelt}={case.rng.choice(good)}"
    if how == "deletion":
        return f"~{key}"
    if how == "grammar":
        return f"{key}=[{case.rng.choice(good)},"
    return f"{key}={case.rng.choice(bad)}"


def preflight_case(case: Case) -> Callable[[], Any]:
    """A config composed with drawn overrides and checked as ``doctor`` and ``rehearse`` check it."""
    from dapo_verl.adapter.preflight import DAPO_ENTRY, compose_and_check, load_verl_checks
    from dapo_verl.rehearsal.run import compose_recipe

    load_verl_checks()  # once per process; the case's time is the check's

    name = case.rng.choice(_CONFIGS)
    keys = case.rng.sample(sorted(_KEYS), case.rng.randint(1, 3))
    overrides = [_override(case, key) for key in keys]
    case.note(f"{name} {' '.join(overrides)}")

    def run() -> None:
        compose_and_check(
            lambda: compose_recipe(name, overrides)[0], entry_module=DAPO_ENTRY, unset_env_is_problem=False
        )  # ConfigRefused (a ValueError) names what it refuses

    return run
