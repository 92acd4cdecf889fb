"""Helpers for driving verl's own code on CPU: actor configs, padded micro-batches, a tiny tokenizer."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("verl")

from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig
from verl.workers.utils.padding import left_right_2_no_padding

import dapo_verl.adapter.register  # noqa: F401  (explicit registration: tests must not depend on install mode)


def actor_config(loss_mode="dapo", *, low=0.2, high=0.28, c=3.0, agg="token-mean", clip_ratio=0.2) -> ActorConfig:
    """A worker-side actor config as verl builds it (verified pattern from verl's own CPU tests)."""
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=clip_ratio,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        loss_agg_mode=agg,
        policy_loss=PolicyLossConfig(loss_mode=loss_mode),
    )


def random_rollout(gen: torch.Generator, *, batch=8, prompt_len=3, response_len=6, dtype=torch.float64):
    """Padded rollout tensors plus a leaf of per-position log-probs (B, P+R) that requires grad."""
    prompt_lens = torch.randint(1, prompt_len + 1, (batch,), generator=gen)
    response_lens = torch.randint(1, response_len + 1, (batch,), generator=gen)
    positions_p = torch.arange(prompt_len).unsqueeze(0)
    positions_r = torch.arange(response_len).unsqueeze(0)
    prompt_mask = positions_p >= (prompt_len - prompt_lens).unsqueeze(1)  # left padded
    response_mask = positions_r < response_lens.unsqueeze(1)  # right padded
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1).long()
    input_ids = torch.randint(3, 50, attention_mask.shape, generator=gen) * attention_mask
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp_min(0)
    full_logp = (-torch.rand(attention_mask.shape, generator=gen, dtype=dtype) * 2).requires_grad_(True)
    old = -torch.rand(batch, response_len, generator=gen, dtype=dtype) * 2
    adv_rows = torch.randn(batch, generator=gen, dtype=dtype)
    return {
        "prompts": input_ids[:, :prompt_len],
        "responses": input_ids[:, prompt_len:],
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask.long(),
        "old_log_probs": old,
        "advantages": adv_rows.unsqueeze(-1) * response_mask,
        "full_logp": full_logp,
    }


def micro_batch(rollout: dict, rows: torch.Tensor, *, dp_size: int, batch_num_tokens, global_batch_size):
    """(model_output, TensorDict) for ppo_loss, the way verl's engine hands a micro-batch to the loss."""
    keys = [
        "prompts",
        "responses",
        "input_ids",
        "attention_mask",
        "position_ids",
        "response_mask",
        "old_log_probs",
        "advantages",
    ]
    td = TensorDict({k: rollout[k][rows] for k in keys}, batch_size=[len(rows)])
    td = left_right_2_no_padding(td)
    tu.assign_non_tensor(td, dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
    attention = rollout["attention_mask"][rows].bool()
    flat_logp = rollout["full_logp"][rows][attention]  # row-major valid tokens, as unpad_input orders them
    return {"log_probs": flat_logp}, td


@pytest.fixture
def tiny_tokenizer():
    """A word-level tokenizer built in code: digits, a few words, pad/eos."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "Answer:", "wrong", *[str(i) for i in range(10)], "the", "is"]
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
