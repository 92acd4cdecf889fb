"""Batch transforms on verl ``DataProto`` batches.

Overlong filtering (DAPO, arXiv 2503.14476, §3.4): truncated responses -- those that fill the response
budget without an end-of-sequence token -- contribute no loss. Their ``response_mask`` is switched off, so
they leave the loss and its token-mean divisor; their rewards still count in their group's baseline.
Apply it before old log-probs and advantages are computed.
"""

from __future__ import annotations

import torch
from verl import DataProto

from dapo_verl.core import mask_truncated_responses, truncated_response_mask

__all__ = ["apply_overlong_filtering", "no_op_groups", "response_truncation"]


def response_truncation(batch: DataProto, eos_token_id: int | list[int] | None) -> torch.Tensor:
    """(B,) bool: which responses of ``batch`` were cut off at the budget (``responses.shape[-1]``)."""
    responses = batch.batch["responses"]  # (B, L)
    mask = batch.batch.get("response_mask", None)
    if mask is None:
        mask = batch.batch["attention_mask"][:, -responses.shape[-1] :]
    lengths = mask.sum(dim=-1).long()  # (B,)
    last = responses.gather(1, (lengths - 1).clamp_min(0).unsqueeze(-1)).squeeze(-1)  # (B,)
    eos_ids = [] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id)
    ended = torch.zeros_like(lengths, dtype=torch.bool)
    for eos in eos_ids:
        ended |= last == eos
    return truncated_response_mask(lengths, responses.shape[-1], eos_emitted=ended & (lengths > 0))


def apply_overlong_filtering(batch: DataProto, eos_token_id: int | list[int] | None) -> dict[str, float]:
    """Zero the ``response_mask`` of truncated responses in place; returns ``dapo/overlong/filtered_fraction``.

    Creates ``response_mask`` from the attention mask first if the batch has none.
    """
    responses = batch.batch["responses"]
    if "response_mask" not in batch.batch:
        batch.batch["response_mask"] = batch.batch["attention_mask"][:, -responses.shape[-1] :].clone()
    truncated = response_truncation(batch, eos_token_id)
    batch.batch["response_mask"] = mask_truncated_responses(batch.batch["response_mask"], truncated)
    return {"dapo/overlong/filtered_fraction": float(truncated.float().mean()) if truncated.numel() else 0.0}


def no_op_groups(group: DataProto, count: int) -> DataProto:
    """``count`` copies of one group's rows that train nothing: no response token counts, scores are zero.

    verl's update needs a batch that splits into whole mini-batches and data-parallel ranks; a partial batch
    (``on_shortfall=partial``) is topped up with these, as verl's v1 trainer tops up short batches with no-op
    samples (``verl/trainer/ppo/padding_utils.py``). With ``response_mask`` zero they add nothing to the loss or
    its token count; their group has zero advantage.
    """
    pad = DataProto.concat([group] * count)
    pad = pad.select_idxs(torch.arange(len(pad)))  # own tensors: zeroing below must not touch ``group``
    pad.batch["attention_mask"][:, -pad.batch["responses"].shape[-1] :] = 0  # verl derives response_mask from it
    for key in ("response_mask", "rm_scores", "token_level_scores", "rollout_log_probs"):
        if key in pad.batch.keys():  # noqa: SIM118 (TensorDict refuses `in` on itself)
            pad.batch[key] = torch.zeros_like(pad.batch[key])
    return pad
