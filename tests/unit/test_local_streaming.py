"""The local backend's streaming engine on the real tiny model: chunked decoding, abort, continuation, the older
prefix masked, token accounting, and the replenisher driving it."""

from __future__ import annotations

import pytest
import torch

from dapo_verl.config import OverlongConfig, SamplerConfig
from dapo_verl.local.config import ModelConfig
from dapo_verl.local.model import load_or_build
from dapo_verl.local.rollout import Rollout
from dapo_verl.local.streaming import ChunkedEngine, current_policy_mask
from dapo_verl.local.tasks import make_task
from dapo_verl.sampler import BatchReplenisher
from dapo_verl.sampler.engine import Request

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")
BUDGET = 24  # long enough that an untrained model's responses end at very different lengths


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    task = make_task("copy3", heldout_size=200, seed=0)
    model, tokenizer, _, _ = load_or_build(
        ModelConfig(), max_positions=task.prompt_length + BUDGET, seed=0, cache_dir=tmp_path_factory.mktemp("cache")
    )
    return task, model, tokenizer


def _rollout(parts) -> Rollout:
    task, model, tokenizer = parts
    return Rollout(
        model,
        tokenizer,
        task,
        n=4,
        temperature=1.0,
        max_response_length=BUDGET,
        overlong=OverlongConfig(overlong_tokens=4),
        device=CPU,
    )


def _requests(prompt_ids, start=1):
    return [Request(request_id=start + i, prompt_id=p, born_step=1) for i, p in enumerate(prompt_ids)]


def test_groups_finish_one_by_one_and_each_response_ends_at_eos_or_the_budget(parts):
    torch.manual_seed(0)
    rollout = _rollout(parts)
    engine = ChunkedEngine(rollout, chunk_tokens=2)
    engine.submit(_requests(range(8)))
    first = engine.collect()
    assert 1 <= len(first) < 8  # not a round: the first groups come back while others still generate
    for request, group in first:
        assert group.prompt_id == request.prompt_id
        ended_by_eos = (group.payload["tokens"] == rollout.eos_id).any(dim=1)
        assert torch.all(ended_by_eos | (group.response_lengths == BUDGET))
        assert torch.equal(group.payload["mask"].sum(dim=1), group.response_lengths)  # one policy: nothing masked
    aborted = engine.abort()
    assert len(aborted.partial) == 8 - len(first) and not aborted.finished
    for _, partial in aborted.partial:
        lengths = [len(t) for t in partial.payload["tokens"]]
        assert partial.tokens == sum(lengths) and partial.finished == sum(partial.payload["ended"])
        assert partial.finished < partial.group_size and max(lengths) < BUDGET
    finished_tokens = sum(int(g.response_lengths.sum()) for _, g in first)
    assert rollout.generated_tokens == finished_tokens + sum(p.tokens for _, p in aborted.partial)  # counted once


def test_a_continued_group_extends_its_prefix_and_masks_the_older_policys_tokens(parts):
    torch.manual_seed(1)
    rollout = _rollout(parts)
    engine = ChunkedEngine(rollout, chunk_tokens=2, stale_prefix="mask")
    engine.submit(_requests(range(8)))
    engine.collect()
    _, partial = engine.abort().partial[0]
    before = rollout.generated_tokens
    engine.policy_version = 1
    engine.submit([Request(request_id=100, prompt_id=partial.prompt_id, born_step=1, resume=partial)])
    (continued,) = engine.collect()
    group = continued[1]
    for r, prefix in enumerate(partial.payload["tokens"]):
        assert group.payload["tokens"][r, : len(prefix)].tolist() == prefix  # continued from its prefix
        versions = group.payload["versions"][r]
        assert versions[: len(prefix)].tolist() == [0] * len(prefix)
        length = int(group.response_lengths[r])
        assert versions[len(prefix) : length].tolist() == [1] * (length - len(prefix))
        assert group.payload["mask"][r].tolist() == [len(prefix) <= t < length for t in range(BUDGET)]
    assert rollout.generated_tokens - before == int(group.response_lengths.sum()) - partial.tokens  # new tokens only


def test_by_default_a_continued_group_trains_its_older_tokens_too(parts):
    torch.manual_seed(1)
    rollout = _rollout(parts)
    engine = ChunkedEngine(rollout, chunk_tokens=2)  # stale_prefix="train"
    engine.submit(_requests(range(8)))
    engine.collect()
    _, partial = engine.abort().partial[0]
    engine.policy_version = 1
    engine.submit([Request(request_id=100, prompt_id=partial.prompt_id, born_step=1, resume=partial)])
    ((_, group),) = engine.collect()
    assert any(partial.payload["tokens"])  # an older prefix exists ...
    for r in range(len(partial.payload["tokens"])):  # ... and every response token is trained, older ones included
        assert group.payload["mask"][r].tolist() == [t < int(group.response_lengths[r]) for t in range(BUDGET)]
    assert (group.payload["versions"][group.payload["mask"]] == 0).any()
    with pytest.raises(ValueError, match="stale_prefix='keep'; expected 'train'"):
        ChunkedEngine(rollout, stale_prefix="keep")


def test_current_policy_mask_keeps_only_the_latest_policys_tokens():
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    versions = torch.tensor([[3, 4, 4, -1], [4, 4, -1, -1]])
    assert current_policy_mask(mask, versions).tolist() == [[False, True, True, False], [True, True, False, False]]


def test_same_seed_same_stream(parts):
    def run():
        torch.manual_seed(7)
        engine = ChunkedEngine(_rollout(parts), chunk_tokens=3)
        engine.submit(_requests(range(5)))
        return [(r.prompt_id, g.payload["tokens"].tolist()) for r, g in engine.collect()]

    assert run() == run()


def test_the_replenisher_on_the_chunked_engine_carries_continues_and_conserves(parts):
    torch.manual_seed(2)
    task = parts[0]
    engine = ChunkedEngine(_rollout(parts), chunk_tokens=2)
    config = SamplerConfig(
        train_batch_size=4, surplus="carry", stream_oversample=2.0, streaming=True, max_num_gen_batches=50
    )
    sampler = BatchReplenisher(config, len(task.train_prompts), engine)
    totals = dict.fromkeys(("aborted_groups", "resumed_groups"), 0.0)
    older_trained = 0
    for step in range(1, 6):
        engine.policy_version = step
        batch = sampler.next_batch()
        assert len(batch.groups) == 4 and sampler.conservation_gap() == 0
        assert batch.metrics["dapo/sampler/trained_token_age_max"] <= config.max_staleness_steps
        for group in batch.groups:
            versions = group.payload["versions"][group.payload["mask"]]  # stale_prefix="train": older ones too
            assert torch.all(step - versions <= config.max_staleness_steps)  # the staleness bound on every token
            older_trained += int((versions < step).sum())
        for name in totals:
            totals[name] += batch.metrics[f"dapo/sampler/{name}"]
    assert totals["aborted_groups"] > 0 and totals["resumed_groups"] > 0 and older_trained > 0


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_chunk_tokens_must_be_a_positive_integer(parts, bad):
    with pytest.raises(ValueError, match=f"chunk_tokens={bad!r}; expected a positive integer"):
        ChunkedEngine(_rollout(parts), chunk_tokens=bad)


def test_a_checkpoint_holding_aborted_groups_resumes_as_the_uninterrupted_run(parts, tmp_path):
    from dapo_verl.state_io import load_state, save_state

    task = parts[0]
    config = SamplerConfig(
        train_batch_size=4, surplus="carry", stream_oversample=2.0, streaming=True, max_num_gen_batches=50
    )

    def sampler():
        engine = ChunkedEngine(_rollout(parts), chunk_tokens=2)
        return engine, BatchReplenisher(config, len(task.train_prompts), engine)

    def steps(engine, replenisher, first, last):
        served = []
        for step in range(first, last + 1):
            engine.policy_version = step
            served.append([(g.prompt_id, g.payload["tokens"].tolist()) for g in replenisher.next_batch().groups])
        return served

    torch.manual_seed(4)
    whole = steps(*sampler(), 1, 4)
    torch.manual_seed(4)
    engine, first = sampler()
    head = steps(engine, first, 1, 2)
    assert first.carried_aborted  # the checkpoint holds groups aborted mid-generation
    save_state(first.state_dict(), tmp_path / "sampler.safetensors")
    rng = torch.get_rng_state()
    engine, resumed = sampler()
    resumed.load_state_dict(load_state(tmp_path / "sampler.safetensors"))
    torch.set_rng_state(rng)
    assert head + steps(engine, resumed, 3, 4) == whole
