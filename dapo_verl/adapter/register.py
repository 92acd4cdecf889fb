"""Registration of dapo_verl into verl's registries -- the target of the ``verl.plugins`` entry point.

verl imports this module on every ``import verl`` (``[project.entry-points."verl.plugins"] dapo = ...``),
so the driver, the TaskRunner, the actor workers and the reward workers all see:

* policy loss ``dapo`` (``actor_rollout_ref.actor.policy_loss.loss_mode=dapo``),
* advantage estimator ``dapo`` (``algorithm.adv_estimator=dapo``),
* reward manager ``dapo_verl`` (``reward.reward_manager.name=dapo_verl``).

Registering is idempotent: importing or calling :func:`register` again is a no-op. A *different* object
already registered under one of these names is an error, never silently replaced.

verl swallows exceptions raised while loading plugins, so if the names are missing run
``dapo-verl doctor``; or make the import explicit and loud with
``actor_rollout_ref.model.external_lib=dapo_verl.adapter.register`` (actor workers and the TaskRunner) or
the environment variable ``VERL_USE_EXTERNAL_MODULES=dapo_verl.adapter.register`` (every process started
with it; on a running Ray cluster pass it through
``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ADV_ESTIMATOR_NAME", "POLICY_LOSS_NAME", "REWARD_MANAGER_NAME", "register", "registration_status"]

POLICY_LOSS_NAME = "dapo"
ADV_ESTIMATOR_NAME = "dapo"
REWARD_MANAGER_NAME = "dapo_verl"


def _same(existing: Any, ours: Any) -> bool:
    """True if ``existing`` is ``ours`` or the same definition from a reloaded module."""
    if existing is ours:
        return True
    return (getattr(existing, "__module__", None), getattr(existing, "__qualname__", None)) == (
        ours.__module__,
        ours.__qualname__,
    )


def _put(registry: dict, name: str, ours: Any, kind: str) -> None:
    existing = registry.get(name)
    if existing is not None and not _same(existing, ours):
        raise ValueError(
            f"verl already has a {kind} named {name!r} ({existing.__module__}.{existing.__qualname__}); dapo_verl "
            f"will not replace it. Uninstall the package that registers it, or use dapo_verl's objects directly."
        )
    registry[name] = ours


def register() -> None:
    """Put the ``dapo`` loss, the ``dapo`` estimator and the ``dapo_verl`` reward manager into verl."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    from dapo_verl.adapter.advantages import compute_dapo_outcome_advantage
    from dapo_verl.adapter.losses import compute_policy_loss_dapo
    from dapo_verl.adapter.reward import DapoRewardManager

    _put(POLICY_LOSS_REGISTRY, POLICY_LOSS_NAME, compute_policy_loss_dapo, "policy loss")
    _put(ADV_ESTIMATOR_REGISTRY, ADV_ESTIMATOR_NAME, compute_dapo_outcome_advantage, "advantage estimator")
    _put(REWARD_MANAGER, REWARD_MANAGER_NAME, DapoRewardManager, "reward manager")


def registration_status() -> dict[str, bool]:
    """Which of dapo_verl's names verl's registries currently hold (for ``dapo-verl doctor`` and tests)."""
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    return {
        f"policy loss {POLICY_LOSS_NAME!r}": POLICY_LOSS_NAME in POLICY_LOSS_REGISTRY,
        f"advantage estimator {ADV_ESTIMATOR_NAME!r}": ADV_ESTIMATOR_NAME in ADV_ESTIMATOR_REGISTRY,
        f"reward manager {REWARD_MANAGER_NAME!r}": REWARD_MANAGER_NAME in REWARD_MANAGER,
    }


register()
