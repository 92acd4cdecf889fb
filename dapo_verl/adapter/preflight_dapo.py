"""What dapo_verl refuses at start-up in a verl config: its own settings, its entry point's needs, its reward manager.

Checks of :func:`dapo_verl.adapter.preflight.verl_config_problems` (each returns one
:class:`~dapo_verl.preflight.Problem` per thing to fix): every DAPO key for ``python -m dapo_verl.main``
(:class:`~dapo_verl.config.DapoConfig`) or, for ``verl.trainer.main_ppo``, the settings of the dapo_verl
components the config names; what the entry point needs (:func:`dapo_entry_problems`); the lengths and batch
sizes verl's data loader reads; the ``dapo_verl`` reward manager's keyword arguments and the filter metric.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dapo_verl.config import (
    AdvantageConfig,
    DapoConfig,
    LossConfig,
    OverlongConfig,
    clip_higher_inert_reason,
    iter_verl_fields,
    read_verl_section,
)
from dapo_verl.preflight import KnownKeys, Problem, one_line

__all__ = [
    "V1_CHECKPOINT_CALLBACK",
    "V1_SAMPLER",
    "clip_higher_warning",
    "component_settings",
    "dapo_entry_problems",
    "data_keys",
    "read_dapo",
    "reward_and_filter",
]

V1_SAMPLER = ("pkg://dapo_verl.adapter.v1_sampler", "DapoReplayBuffer")
V1_CHECKPOINT_CALLBACK = "dapo_verl.adapter.v1_sampler.DapoCheckpointCallback"

_REPORTED_BY_DAPO_VERL = ("acc", "score", "pred", "overlong_penalty", "overlong", "truncated", "response_length")
"""Per-response values the dapo_verl reward manager reports with verl's default score function (math_dapo)."""
_SHAPED = ("seq_reward", "seq_final_reward")
"""Names of the shaped reward the legacy trainer's filter understands (the rollout's ``rm_scores``)."""

_VERL_REWARD_KWARGS = ("overlong_buffer_cfg", "max_resp_len")
"""verl's own names for the overlong settings, which the dapo_verl reward manager reads as aliases of its own."""
_POSITIVE_DATA_KEYS = ("data.max_prompt_length", "data.max_response_length", "data.train_batch_size")


def _get(config: DictConfig, key: str) -> Any:
    return OmegaConf.select(config, key, default=None)


def _problem_from(err: Exception, default_key: str) -> Problem:
    text = one_line(err)
    match = re.match(r"^([A-Za-z_][\w.]*)=", text)
    return Problem(match.group(1) if match else default_key, text)


def read_dapo(config: DictConfig) -> tuple[DapoConfig | None, list[Problem]]:
    """Every DAPO key of a ``python -m dapo_verl.main`` config, read once (:meth:`DapoConfig.from_verl`): the parsed
    config, or None and the problem."""
    try:
        return DapoConfig.from_verl(config), []
    except (ValueError, TypeError) as err:
        return None, [_problem_from(err, "dapo_verl")]


def component_settings(config: DictConfig) -> list[Problem]:
    """For ``verl.trainer.main_ppo``: the settings of the dapo_verl components the config names."""
    from dapo_verl.adapter.reward import reward_settings

    parts: list[tuple[bool, Callable[[], Any]]] = [
        (
            _get(config, "actor_rollout_ref.actor.policy_loss.loss_mode") == "dapo",
            lambda: read_verl_section(LossConfig, config),
        ),
        (_get(config, "algorithm.adv_estimator") == "dapo", lambda: read_verl_section(AdvantageConfig, config)),
        (_get(config, "reward.reward_manager.name") == "dapo_verl", lambda: reward_settings(config)),
    ]
    problems = []
    for used, read in parts:
        if used:
            try:
                read()
            except (ValueError, TypeError) as err:
                problems.append(_problem_from(err, "dapo_verl"))
    return problems


def dapo_entry_problems(config: DictConfig, dapo: DapoConfig) -> list[Problem]:
    """What ``python -m dapo_verl.main`` itself refuses, beyond the values of the DAPO keys."""
    problems = []
    if config.trainer.get("use_v1", False):
        problems += _v1_sampler_problems(config)
    reward_model = config.reward.get("reward_model", {}) or {}
    colocated = reward_model.get("enable", False) and not reward_model.get("enable_resource_pool", False)
    if dapo.sampler.enable and colocated:
        problems.append(
            Problem(
                "reward.reward_model.enable",
                (
                    "reward.reward_model.enable=true with reward.reward_model.enable_resource_pool=false: a "
                    "colocated reward model scores responses only after generation, so dynamic sampling cannot read "
                    f"algorithm.filter_groups.metric={dapo.sampler.metric} while it samples. Give the reward model "
                    "its own GPUs (reward.reward_model.enable_resource_pool=true), use a rule-based reward, or set "
                    "algorithm.filter_groups.enable=false."
                ),
            )
        )
    n = config.actor_rollout_ref.rollout.n
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        problems.append(
            Problem(
                "actor_rollout_ref.rollout.n",
                (
                    f"actor_rollout_ref.rollout.n={n!r}: group-normalised advantages need >= 2 responses per "
                    "prompt. Set actor_rollout_ref.rollout.n (the paper uses 16)."
                ),
            )
        )
    if config.algorithm.adv_estimator == "remax":
        problems.append(
            Problem(
                "algorithm.adv_estimator",
                (
                    "algorithm.adv_estimator=remax needs a greedy baseline rollout per prompt, which the batch "
                    "replenisher does not produce. Use adv_estimator=dapo or grpo."
                ),
            )
        )
    return problems


def clip_higher_warning(config: DictConfig, dapo: DapoConfig) -> None:
    """Warn once when clip-higher cannot act under the config's batching (it is not an error)."""
    actor = config.actor_rollout_ref.actor
    reason = clip_higher_inert_reason(
        train_batch_size=dapo.sampler.train_batch_size,
        ppo_mini_batch_size=actor.ppo_mini_batch_size,
        ppo_epochs=actor.ppo_epochs,
    )
    if reason and dapo.loss.clip_ratio_high != dapo.loss.clip_ratio_low:
        warnings.warn(reason, stacklevel=3)


def _v1_sampler_problems(config: DictConfig) -> list[Problem]:
    problems = []
    sampler = (config.trainer.get("v1", {}) or {}).get("sampler", {}).get("custom_sampler") or {}
    if (sampler.get("path"), sampler.get("name")) != V1_SAMPLER:
        problems.append(
            Problem(
                "trainer.v1.sampler.custom_sampler",
                (
                    f"trainer.v1.sampler.custom_sampler is {{path: {sampler.get('path')}, name: "
                    f"{sampler.get('name')}}}; python -m dapo_verl.main runs dapo_verl's batch replenisher as v1's "
                    f"sampler ({{path: {V1_SAMPLER[0]}, name: {V1_SAMPLER[1]}}}, as dapo/base.yaml sets). To use "
                    "verl's built-in filter_groups instead, run python -m verl.trainer.main_ppo with loss_mode=dapo."
                ),
            )
        )
    if config.trainer.get("checkpoint_callback_class") != V1_CHECKPOINT_CALLBACK:
        problems.append(
            Problem(
                "trainer.checkpoint_callback_class",
                (
                    f"trainer.checkpoint_callback_class={config.trainer.get('checkpoint_callback_class')!r}: without "
                    f"{V1_CHECKPOINT_CALLBACK} the sampler's state (prompt history, carried groups, counters) is not "
                    "saved and a resumed run would repeat or lose groups. Keep dapo/base.yaml's value."
                ),
            )
        )
    return problems


def data_keys(config: DictConfig) -> list[Problem]:
    """The lengths and batch sizes verl's data loader and trainer read are positive integers (or a null gen batch)."""
    problems = []
    for key in _POSITIVE_DATA_KEYS:
        value = _get(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append(
                Problem(
                    key,
                    f"{key}={value!r} must be a positive integer; verl's data loader and "
                    f"trainer size batches and sequences by it. Set {key} to a whole number.",
                )
            )
    gen = _get(config, "data.gen_batch_size")
    if gen is not None and (isinstance(gen, bool) or not isinstance(gen, int) or gen < 1):
        problems.append(
            Problem(
                "data.gen_batch_size",
                f"data.gen_batch_size={gen!r} must be a positive integer or "
                f"null (train_batch_size). Set it to a number of prompts.",
            )
        )
    return problems


def reward_and_filter(config: DictConfig) -> list[Problem]:
    """The ``dapo_verl`` reward manager's keyword arguments, and the filter metric against what it reports."""
    return _reward_kwargs(config) + _filter_metric(config)


def _reward_kwargs(config: DictConfig) -> list[Problem]:
    """The dapo_verl reward manager reads only its own ``reward.reward_kwargs``; any other key would be ignored."""
    kwargs = _get(config, "reward.reward_kwargs")
    if _get(config, "reward.reward_manager.name") != "dapo_verl" or not isinstance(kwargs, DictConfig):
        return []
    prefix = "reward.reward_kwargs."
    known = KnownKeys.of(
        {
            "reward": {
                "reward_kwargs": {
                    **{
                        key[len(prefix) :]: None
                        for key, _ in iter_verl_fields(OverlongConfig)
                        if key.startswith(prefix)
                    },
                    **dict.fromkeys(_VERL_REWARD_KWARGS),
                }
            }
        }
    )
    return [
        Problem(
            prefix + name,
            f"{prefix}{name} is not read by the dapo_verl reward manager, so the run would "
            f"ignore it; {known.hint(prefix + name)} It reads "
            f"{', '.join(sorted(k[len(prefix) :] for k in known.leaves))}.",
        )
        for name in kwargs
        if prefix + name not in known
    ]


def _filter_metric(config: DictConfig) -> list[Problem]:
    if not _get(config, "algorithm.filter_groups.enable"):
        return []
    metric = _get(config, "algorithm.filter_groups.metric")
    manager = _get(config, "reward.reward_manager.name")
    custom = _get(config, "reward.custom_reward_function.path") or _get(config, "custom_reward_function.path")
    if manager != "dapo_verl" or custom or metric in (*_REPORTED_BY_DAPO_VERL, *_SHAPED) or metric is None:
        return []
    return [
        Problem(
            "algorithm.filter_groups.metric",
            (
                f"algorithm.filter_groups.metric={metric!r} is not a value the dapo_verl reward manager reports (it "
                f"reports {', '.join(_REPORTED_BY_DAPO_VERL)} with verl's default score function), so dynamic sampling "
                "would fail at its first batch. Set algorithm.filter_groups.metric=acc (raw correctness)."
            ),
        )
    ]
