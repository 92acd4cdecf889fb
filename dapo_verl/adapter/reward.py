"""verl reward manager ``dapo_verl``: the rule-based score plus DAPO's soft overlong punishment.

It extends what verl's built-in ``dapo`` manager does in three ways:

* the punishment comes from ``dapo_verl.core.overlong_penalty`` with a schedule from the core registry
  (``linear`` as in the paper, ``quadratic``, or your own);
* it is configured with the names used throughout dapo_verl -- ``reward.reward_kwargs.overlong_reward_penalty``,
  ``overlong_tokens``, ``overlong_penalty_factor``, ``overlong_schedule`` -- and also accepts verl's own
  ``overlong_buffer_cfg.{enable,len,penalty_factor}`` keys (contradicting values are refused); the budget is
  ``data.max_response_length`` (verl's ``reward_kwargs.max_resp_len``, if given, must agree);
* it records raw correctness separately from the shaped reward, so dynamic sampling can filter on ``acc``:
  every response's ``reward_extra_info`` holds the score function's keys plus ``acc`` (raw correctness),
  ``overlong_penalty`` (<= 0), ``overlong`` (inside the buffer), ``truncated`` (at the budget) and
  ``response_length``. :func:`overlong_metrics` turns them into per-step statistics.

Configuration errors surface when the manager is built (verl builds it at start-up in every reward
worker), naming the key and the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import default_compute_score

from dapo_verl.config import OverlongConfig, read_verl_section
from dapo_verl.core import overlong_penalty

__all__ = ["DapoRewardManager", "overlong_metrics", "reward_settings"]


def _max_response_length(config: Mapping[str, Any]) -> int:
    data = config.get("data") or {}
    reward_kwargs = (config.get("reward") or {}).get("reward_kwargs") or {}
    budget = data.get("max_response_length") or reward_kwargs.get("max_resp_len")
    if not budget:
        raise ValueError(
            "The dapo_verl reward manager needs the response budget to place the overlong penalty, but neither "
            "data.max_response_length nor reward.reward_kwargs.max_resp_len is set. Set data.max_response_length."
        )
    return int(budget)


def reward_settings(config: Mapping[str, Any]) -> tuple[OverlongConfig, int]:
    """Validated overlong settings and the response budget from a full verl config.

    Raises:
        ValueError: for an unknown schedule, a non-positive or too long buffer, a negative factor, a missing
            budget, or verl alias keys that contradict ours; the message names the key and the fix.
    """
    overlong = read_verl_section(OverlongConfig, config)
    budget = _max_response_length(config)
    if overlong.overlong_reward_penalty and overlong.overlong_tokens > budget:
        raise ValueError(
            f"reward.reward_kwargs.overlong_tokens={overlong.overlong_tokens} exceeds data.max_response_length="
            f"{budget}; the penalty ramp must fit inside the response budget. Set overlong_tokens <= {budget} "
            f"(the paper uses 4096 of 20480)."
        )
    return overlong, budget


class DapoRewardManager(RewardManagerBase):
    """Rule-based score + soft overlong punishment, with raw correctness kept apart (see the module docstring)."""

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.compute_score = compute_score or default_compute_score
        self.is_async_reward_score = inspect.iscoroutinefunction(self.compute_score)
        self.overlong, self.max_response_length = reward_settings(config)
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer

    async def run_single(self, data: DataProto) -> dict:
        """Score one response; returns verl's ``{"reward_score": float, "reward_extra_info": dict}``."""
        item = data[-1:][0]  # multi-sequence outputs: the last sequence carries the reward, as in verl
        response_ids = item.batch["responses"]
        length = int(item.batch["attention_mask"][-response_ids.shape[-1] :].sum())
        text = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(response_ids[:length], skip_special_tokens=True)
        )
        result = await self._score(item, text)
        extra = dict(result) if isinstance(result, dict) else {"acc": result}
        score = float(result["score"]) if isinstance(result, dict) else float(result)
        extra.setdefault("acc", score)
        penalty = 0.0
        if self.overlong.overlong_reward_penalty:
            penalty = float(
                overlong_penalty(
                    torch.tensor([length]),
                    self.max_response_length,
                    self.overlong.overlong_tokens,
                    self.overlong.overlong_penalty_factor,
                    schedule=self.overlong.overlong_schedule,
                )[0]
            )
        eos = getattr(self.tokenizer, "eos_token_id", None)
        ended = length > 0 and eos is not None and int(response_ids[length - 1]) == eos
        extra.update(
            overlong_penalty=penalty,
            overlong=penalty < 0,
            truncated=length >= self.max_response_length and not ended,
            response_length=length,
        )
        return {"reward_score": score + penalty, "reward_extra_info": extra}

    async def _score(self, item, text: str) -> Any:
        kwargs = {
            "data_source": item.non_tensor_batch["data_source"],
            "solution_str": text,
            "ground_truth": item.non_tensor_batch["reward_model"]["ground_truth"],
            "extra_info": item.non_tensor_batch.get("extra_info", {}),
        }
        if self.reward_router_address is not None:
            kwargs.update(
                reward_router_address=self.reward_router_address, reward_model_tokenizer=self.reward_model_tokenizer
            )
        if self.is_async_reward_score:
            return await self.compute_score(**kwargs)
        return await self.loop.run_in_executor(None, lambda: self.compute_score(**kwargs))


def overlong_metrics(non_tensor_batch: Mapping[str, Any]) -> dict[str, float]:
    """Per-step overlong statistics from the reward manager's extra info (empty if absent).

    Keys: ``dapo/overlong/in_buffer_fraction`` (share of responses with a penalty),
    ``dapo/overlong/truncated_fraction`` (share at the budget) and ``dapo/overlong/penalty_mean``.
    """
    if "overlong_penalty" not in non_tensor_batch:
        return {}
    penalty = np.asarray(non_tensor_batch["overlong_penalty"], dtype=np.float64)
    truncated = np.asarray(non_tensor_batch["truncated"], dtype=np.float64)
    return {
        "dapo/overlong/in_buffer_fraction": float((penalty < 0).mean()) if penalty.size else 0.0,
        "dapo/overlong/truncated_fraction": float(truncated.mean()) if truncated.size else 0.0,
        "dapo/overlong/penalty_mean": float(penalty.mean()) if penalty.size else 0.0,
    }
