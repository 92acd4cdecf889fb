"""The files `dapo-verl prepare-data` writes load in verl's RLHFDataset and score with verl's math_dapo, on CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("verl")

import datasets
from omegaconf import OmegaConf
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.reward_score import default_compute_score

from dapo_verl.data import PrepareOptions, is_math_dapo_data_source, prepare_data
from tests.data_prep_samples import write_aime_bytedtsinghua, write_aime_h4, write_dapo_math

pytestmark = pytest.mark.verl

_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _tokenizer():
    """A word-level tokenizer built in code (no download), with a chat template for verl's length filter."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "Answer", ":", "user", "assistant", *[str(i) for i in range(10)]]
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer


@pytest.fixture
def prepared(tmp_path: Path, monkeypatch):
    # datasets.load_dataset would otherwise cache under ~/.cache/huggingface (FIT_ON_CPU.md).
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    return prepare_data(
        out_dir=tmp_path / "data",
        dapo_math=write_dapo_math(tmp_path / "in" / "dapo.parquet"),
        aime=write_aime_bytedtsinghua(tmp_path / "in" / "aime.parquet"),
        options=PrepareOptions(aime_repeat=32),
    )


def _dataset(path: Path, tmp_path: Path, **config) -> RLHFDataset:
    base = {
        "cache_dir": str(tmp_path / "verl_cache"),
        "prompt_key": "prompt",
        "max_prompt_length": 2048,
        "filter_overlong_prompts": True,
        "filter_overlong_prompts_workers": 1,
        "truncation": "left",
    }
    return RLHFDataset(data_files=[str(path)], tokenizer=_tokenizer(), config=OmegaConf.create({**base, **config}))


def test_rlhf_dataset_reads_every_written_file(prepared, tmp_path):
    sizes = {name: len(_dataset(prepared.files[name], tmp_path)) for name in ("train", "aime", "aime_repeated")}
    assert sizes == {"train": 6, "aime": 30, "aime_repeated": 960}


def test_rlhf_dataset_rows_carry_what_the_trainer_and_reward_manager_read(prepared, tmp_path):
    train = _dataset(prepared.files["train"], tmp_path)
    row = train[0]
    assert [dict(m) for m in row["raw_prompt"]] == [dict(m) for m in row["prompt"]]
    assert row["raw_prompt"][0]["role"] == "user" and "Answer:" in row["raw_prompt"][0]["content"]
    assert row["index"] == 0 and row["data_source"] == "math_dapo"
    assert isinstance(row["reward_model"]["ground_truth"], str)
    assert row["extra_info"]["source_id"].startswith("u")


def test_verl_length_filter_tokenizes_the_prompts(prepared, tmp_path):
    # Every DAPO prompt is longer than 8 words, so verl's filter (chat template + tokenizer) drops them all.
    assert len(_dataset(prepared.files["train"], tmp_path, max_prompt_length=8)) == 0


@pytest.mark.parametrize("name", ["train", "aime"])
def test_default_compute_score_scores_the_written_data_source(prepared, tmp_path, name):
    row = _dataset(prepared.files[name], tmp_path)[3]
    truth = row["reward_model"]["ground_truth"]
    right = default_compute_score(row["data_source"], f"Some steps.\nAnswer: {truth}", truth, row["extra_info"])
    wrong = default_compute_score(row["data_source"], "Some steps.\nAnswer: 123456789", truth, row["extra_info"])
    assert (right["acc"], right["score"]) == (True, 1.0)
    assert (wrong["acc"], wrong["score"]) == (False, -1.0)


def test_plain_aime_answers_score_as_built(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf")
    files = prepare_data(out_dir=tmp_path / "data", aime=write_aime_h4(tmp_path / "h4.parquet")).files
    row = _dataset(files["aime"], tmp_path)[0]
    assert default_compute_score(row["data_source"], "Answer: 100", row["reward_model"]["ground_truth"])["acc"]


@pytest.mark.parametrize("name", ["math_dapo", "math", "aime-2024", "aime24", "AIME24", "gsm8k_dapo"])
def test_routing_rule_matches_verl(name):
    try:
        routed = "acc" in default_compute_score(name, "Answer: 1", "1")
    except NotImplementedError:
        routed = False
    assert routed == is_math_dapo_data_source(name)
