"""``python -m dapo_verl.main``: DAPO on verl (Hydra entry point; config ``configs/dapo_trainer.yaml``).

Like ``verl.trainer.main_ppo`` it validates the config and starts Ray with a TaskRunner:

* ``trainer.use_v1=true`` (the default, as in verl): verl's own v1 TaskRunner; the config names
  :class:`~dapo_verl.adapter.v1_sampler.DapoReplayBuffer` as its custom sampler and
  :class:`~dapo_verl.adapter.v1_sampler.DapoCheckpointCallback` as its checkpoint callback.
* ``trainer.use_v1=false``: verl's legacy TaskRunner, building :class:`~dapo_verl.adapter.trainer.DapoRayTrainer`
  (verl deprecates the legacy trainer).

``--help`` and ``--cfg job`` show the resolved configuration without starting anything.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import hydra
from omegaconf import DictConfig

from dapo_verl.config import DapoConfig, clip_higher_inert_reason

__all__ = ["main", "run_dapo", "validate_dapo_config"]

logger = logging.getLogger(__name__)


def validate_dapo_config(config: DictConfig) -> DapoConfig:
    """Check the DAPO-specific parts of a composed config; return the parsed :class:`DapoConfig`.

    Raises:
        ValueError: naming the offending key and the fix.
    """
    dapo = DapoConfig.from_verl(config)
    if config.trainer.get("use_v1", False):
        _check_v1_sampler(config)
    reward_model = config.reward.get("reward_model", {})
    colocated_reward_model = reward_model.get("enable", False) and not reward_model.get("enable_resource_pool", False)
    if dapo.sampler.enable and colocated_reward_model:
        raise ValueError(
            "reward.reward_model.enable=true with reward.reward_model.enable_resource_pool=false: a colocated reward "
            "model scores responses only after generation, so dynamic sampling cannot read "
            f"algorithm.filter_groups.metric={dapo.sampler.metric} while it samples. Give the reward model its own "
            "GPUs (reward.reward_model.enable_resource_pool=true), use a rule-based reward, or set "
            "algorithm.filter_groups.enable=false."
        )
    n = config.actor_rollout_ref.rollout.n
    if n < 2:
        raise ValueError(f"actor_rollout_ref.rollout.n={n}: group-normalised advantages need >= 2 responses per "
                         f"prompt. Set actor_rollout_ref.rollout.n (the paper uses 16).")
    if config.algorithm.adv_estimator == "remax":
        raise ValueError("algorithm.adv_estimator=remax needs a greedy baseline rollout per prompt, which the batch "
                         "replenisher does not produce. Use adv_estimator=dapo or grpo.")
    reason = clip_higher_inert_reason(
        train_batch_size=dapo.sampler.train_batch_size,
        ppo_mini_batch_size=config.actor_rollout_ref.actor.ppo_mini_batch_size,
        ppo_epochs=config.actor_rollout_ref.actor.ppo_epochs,
    )
    if reason and dapo.loss.clip_ratio_high != dapo.loss.clip_ratio_low:
        warnings.warn(reason, stacklevel=2)
    return dapo


V1_SAMPLER = ("pkg://dapo_verl.adapter.v1_sampler", "DapoReplayBuffer")
V1_CHECKPOINT_CALLBACK = "dapo_verl.adapter.v1_sampler.DapoCheckpointCallback"


def _check_v1_sampler(config: DictConfig) -> None:
    sampler = config.trainer.v1.sampler.get("custom_sampler") or {}
    if (sampler.get("path"), sampler.get("name")) != V1_SAMPLER:
        raise ValueError(
            f"trainer.v1.sampler.custom_sampler is {{path: {sampler.get('path')}, name: {sampler.get('name')}}}; "
            f"python -m dapo_verl.main runs dapo_verl's batch replenisher as v1's sampler ({{path: {V1_SAMPLER[0]}, "
            f"name: {V1_SAMPLER[1]}}}, as dapo/base.yaml sets). To use verl's built-in filter_groups instead, run "
            f"python -m verl.trainer.main_ppo with loss_mode=dapo."
        )
    if config.trainer.get("checkpoint_callback_class") != V1_CHECKPOINT_CALLBACK:
        raise ValueError(
            f"trainer.checkpoint_callback_class={config.trainer.get('checkpoint_callback_class')!r}: without "
            f"{V1_CHECKPOINT_CALLBACK} the sampler's state (prompt history, carried groups, counters) is not saved "
            f"and a resumed run would repeat or lose groups. Keep dapo/base.yaml's value."
        )


@contextlib.contextmanager
def _trainer_class(namespace: dict[str, Any], trainer_cls: type) -> Iterator[None]:
    """Make verl's ``TaskRunner.run`` build ``trainer_cls`` instead of ``RayPPOTrainer``.

    ``TaskRunner.run`` (verl/trainer/main_ppo_v0.py) constructs the trainer through the global name
    ``RayPPOTrainer``. ``namespace`` must be the globals of the ``run`` function that executes: Ray ships
    the TaskRunner class to its process by value (cloudpickle cannot find ``@ray.remote``'s original class by
    name), so ``run`` reads a copy of the module's globals, not ``verl.trainer.main_ppo_v0`` itself. Swapping
    the name there is the smallest override that avoids copying ``run``.
    """
    original = namespace["RayPPOTrainer"]
    namespace["RayPPOTrainer"] = trainer_cls
    try:
        yield
    finally:
        namespace["RayPPOTrainer"] = original


def _task_runner_class() -> Any:
    import ray
    from verl.trainer.main_ppo_v0 import TaskRunner

    from dapo_verl.adapter.trainer import DapoRayTrainer

    class DapoTaskRunner(TaskRunner.__ray_actor_class__):
        """verl's TaskRunner, building :class:`~dapo_verl.adapter.trainer.DapoRayTrainer`."""

        def run(self, config):
            with _trainer_class(super().run.__func__.__globals__, DapoRayTrainer):
                return super().run(config)

    return ray.remote(num_cpus=1)(DapoTaskRunner)


def run_dapo(config: DictConfig) -> None:
    """Validate ``config`` and train with Ray workers (needs the GPUs the config asks for)."""
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    import dapo_verl.adapter.register  # noqa: F401  (the driver process too; the workers get the entry point)

    auto_set_device(config)
    validate_dapo_config(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    if config.trainer.use_v1:
        from verl.trainer.main_ppo import TaskRunnerV1

        run_ppo(config, task_runner_class=TaskRunnerV1)
    else:
        logger.warning("trainer.use_v1=false: verl's legacy trainer, which verl deprecates; dapo_verl's batch "
                       "replenisher drives it as it drives the v1 trainer's sampler.")
        run_ppo(config, task_runner_class=_task_runner_class())


@hydra.main(config_path="configs", config_name="dapo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """Hydra entry point."""
    run_dapo(config)


if __name__ == "__main__":
    main()
