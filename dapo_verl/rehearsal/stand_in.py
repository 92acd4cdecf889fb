"""The rehearsal's stand-in policy: a tiny Qwen2 model and a byte-level tokenizer, built in code.

The recipes train Qwen2.5 models, which a CPU machine can neither download nor run. The stand-in keeps what
verl's code path depends on -- the ``qwen2`` architecture (so verl's monkey patches and FSDP wrapping are the
recipe's), Qwen2.5's chat format (ChatML with its default system message), a byte-level BPE tokenizer (any
text round-trips, as with Qwen's) -- and shrinks the rest to about 130k parameters.

Its behaviour is set by hand so that a DAPO run has something to filter: the output head is biased towards
three tokens, ``<|im_end|>`` and two single tokens ``"\\nAnswer: 1"`` and ``"\\nAnswer: 2"``. A sampled response
is a short run of answer tokens ended by ``<|im_end|>``; ``math_dapo`` reads its last ``Answer:`` line, so on a
problem whose answer is 1 or 2 each response is correct with probability about 0.35, and groups of responses
are mixed (informative) or all wrong -- the two cases dynamic sampling must tell apart. Some responses run
into the overlong buffer or are truncated. Training moves these probabilities like any other weights.

Shape legend: V vocabulary size, H hidden size.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

__all__ = [
    "ANSWER_TOKENS",
    "QWEN25_CHAT_TEMPLATE",
    "STAND_IN_VERSION",
    "build_stand_in",
    "build_tokenizer",
    "stand_in_parameter_count",
]

STAND_IN_VERSION = 3
"""Bumped whenever the built model or tokenizer changes, so cached copies are rebuilt."""

QWEN25_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Qwen2.5's chat format (ChatML with its default system message; tool calls omitted)."""

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ANSWER_TOKENS = ("\nAnswer: 1", "\nAnswer: 2")
"""Single tokens the stand-in prefers; ``math_dapo`` scores a response by the last one it contains."""

# Next-token probabilities of the biased head; the rest of the vocabulary shares _OTHER_MASS.
_TARGET = {"<|im_end|>": 0.3, ANSWER_TOKENS[0]: 0.35, ANSWER_TOKENS[1]: 0.35}
_OTHER_MASS = 1e-3
_HIDDEN, _LAYERS, _HEADS, _KV_HEADS, _INTERMEDIATE = 64, 2, 2, 1, 128
_VOCAB_SIZE = 512  # bytes plus merges


def _merge_corpus() -> list[str]:
    """Texts the stand-in's BPE merges are learned from: Qwen's default system turn, the DAPO template, numbers."""
    from dapo_verl.data.schema import DAPO_PROMPT_PREFIX, DAPO_PROMPT_SUFFIX

    system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    problems = [f"Problem {i}: what is {i % 20} - {i % 10}?" for i in range(200)]
    return [system, DAPO_PROMPT_PREFIX, DAPO_PROMPT_SUFFIX] * 50 + problems


def build_tokenizer():
    """A byte-level BPE tokenizer: 256 byte tokens, merges learned from the DAPO template, Qwen's specials.

    The merges keep a templated DAPO prompt near 110 tokens (about what Qwen's tokenizer gives); any other
    text still encodes, byte by byte. ``"\nAnswer: 1"`` and ``"\nAnswer: 2"`` are single added tokens.

    Example:
        >>> tok = build_tokenizer()
        >>> tok.decode(tok("Answer: 42 ✓")["input_ids"])
        'Answer: 42 ✓'
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_SIZE,
        show_progress=False,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    core.train_from_iterator(_merge_corpus(), trainer=trainer)
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    core.add_tokens([AddedToken(t, special=False, normalized=False) for t in ANSWER_TOKENS])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = QWEN25_CHAT_TEMPLATE
    return tokenizer


def _biased_model(tokenizer, seed: int):
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=_HIDDEN,
        intermediate_size=_INTERMEDIATE,
        num_hidden_layers=_LAYERS,
        num_attention_heads=_HEADS,
        num_key_value_heads=_KV_HEADS,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.02,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        # A constant first residual coordinate survives the blocks (their outputs are ~0.02 wide) and RMSNorm
        # scales it to ~sqrt(H); the head's first column then sets the logits almost regardless of context.
        model.model.embed_tokens.weight[:, 0] = 1.0
        # Other tokens get logit 0 and share _OTHER_MASS; a target of probability p gets log(p' K / _OTHER_MASS).
        others = config.vocab_size - len(_TARGET)
        logits = torch.zeros(config.vocab_size)  # (V,)
        for token, prob in _TARGET.items():
            share = prob * (1.0 - _OTHER_MASS)
            logits[tokenizer.convert_tokens_to_ids(token)] = math.log(share * others / _OTHER_MASS)
        model.lm_head.weight[:, 0] = logits / _HIDDEN**0.5
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
    )
    return model


def stand_in_parameter_count() -> int:
    """Parameters of the stand-in model."""
    return sum(p.numel() for p in _biased_model(build_tokenizer(), seed=0).parameters())


def build_stand_in(path: str | os.PathLike, *, seed: int = 0) -> Path:
    """Write the stand-in model and tokenizer to ``path`` in Hugging Face format; return ``path``.

    An existing complete copy of the same version and seed is reused, so repeated rehearsals start from the
    identical model.
    """
    path = Path(path)
    marker = path / "dapo_verl_stand_in.json"
    expected = {"version": STAND_IN_VERSION, "seed": seed}
    if marker.exists() and json.loads(marker.read_text()) == expected:
        return path
    from dapo_verl.local.model import quiet_hf_progress

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = _biased_model(tokenizer, seed)
    with quiet_hf_progress():
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    marker.write_text(json.dumps(expected))
    return path
