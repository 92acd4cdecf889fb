"""The clip-acts ingredients of the local backend: decoys, the warm start, and pass@k on held-out prompts."""

from __future__ import annotations

import pytest
import torch

from dapo_verl.config import OverlongConfig
from dapo_verl.local.config import ModelConfig, WarmStartConfig
from dapo_verl.local.model import load_or_build
from dapo_verl.local.rollout import Rollout, encode
from dapo_verl.local.tasks import decoy_answers, make_task
from dapo_verl.local.warm_start import warm_start

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CPU = torch.device("cpu")


def test_decoys_are_the_wrong_rules_answers():
    assert decoy_answers("copy3", ["1234>", "5555>"]) == [["1", "2", "4"], ["5", "5", "5"]]
    assert decoy_answers("summod", ["3+4="]) == [["3", "4"]]
    assert decoy_answers("summod2", ["13+48="]) == [["3", "8"]]
    with pytest.raises(ValueError, match="copy3"):
        decoy_answers("nosuchtask", ["1234>"])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    task = make_task("copy3", heldout_size=200, seed=0)
    model, tokenizer, _, _ = load_or_build(
        ModelConfig(), max_positions=task.prompt_length + 6, seed=0, cache_dir=tmp_path_factory.mktemp("cache")
    )
    return task, model, tokenizer


def _first_token_probs(model, tokenizer, prompts):
    with torch.no_grad():
        return torch.softmax(model(input_ids=encode(tokenizer, prompts)).logits[:, -1], dim=-1)  # (P, V)


def test_no_warm_start_leaves_the_model_untouched(setup):
    task, model, tokenizer = setup
    before = [p.clone() for p in model.parameters()]
    assert warm_start(model, tokenizer, task, WarmStartConfig(steps=0), seed=0, device=CPU) == {}
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_warm_start_makes_the_decoys_likely_and_the_answer_rare_on_held_out_prompts(setup):
    task, model, tokenizer = setup
    rng = torch.get_rng_state()
    metrics = warm_start(model, tokenizer, task, WarmStartConfig(steps=120, correct_prob=0.05), seed=0, device=CPU)
    assert torch.equal(rng, torch.get_rng_state())  # RL's sampling does not depend on the warm start
    probs = _first_token_probs(model, tokenizer, task.eval_prompts)
    answers = encode(tokenizer, task.eval_answers)[:, 0]
    decoys = encode(tokenizer, ["".join(d) for d in decoy_answers("copy3", task.eval_prompts)])  # (P, 3)
    apart = (decoys != answers.unsqueeze(1)).all(dim=1)  # prompts whose answer is no decoy: target 0.05
    correct = probs.gather(1, answers.unsqueeze(1)).squeeze(1)
    assert apart.sum() > 100
    assert correct[apart].mean() < 0.12  # the target gives it 0.05
    decoy_mass = torch.stack([probs.gather(1, decoys[:, j : j + 1]).squeeze(1) for j in range(3)]).sum(0)
    assert decoy_mass[apart].mean() > 0.8  # the rest of the target, 0.95, is on the three decoys
    assert metrics["dapo/warm_start/heldout_correct_prob"] == pytest.approx(correct.mean().item(), abs=1e-5)
    assert 0.5 < metrics["dapo/warm_start/heldout_answer_entropy"] < 1.5  # confident, not collapsed: ln 3 = 1.1


def _rollout(setup, val_n):
    task, model, tokenizer = setup
    overlong = OverlongConfig(overlong_tokens=4)
    return Rollout(
        model,
        tokenizer,
        task,
        n=8,
        temperature=1.0,
        max_response_length=6,
        overlong=overlong,
        device=CPU,
        val_n=val_n,
        seed=3,
    )


def test_evaluation_logs_pass_at_k_under_verls_names_reproducibly_without_touching_trainings_rng(setup):
    rollout = _rollout(setup, 8)
    rng = torch.get_rng_state()
    first, again = rollout.evaluate(step=5), rollout.evaluate(step=5)
    assert torch.equal(rng, torch.get_rng_state())
    assert first == again  # seeded by (data.seed, step): a resumed run evaluates the same
    assert rollout.evaluate(step=10) != first
    keys = {
        "val-aux/copy3/acc/mean@8",
        "val-aux/copy3/acc/best@2/mean",
        "val-aux/copy3/acc/best@4/mean",
        "val-core/copy3/acc/best@8/mean",
        "val-core/copy3/acc/mean@1",
    }
    assert keys <= set(first)
    curve = [
        first["val-aux/copy3/acc/mean@8"],
        first["val-aux/copy3/acc/best@2/mean"],
        first["val-aux/copy3/acc/best@4/mean"],
        first["val-core/copy3/acc/best@8/mean"],
    ]
    assert curve == sorted(curve) and 0 < curve[0] < curve[-1] <= 1  # pass@k rises with k
    greedy_only = _rollout(setup, 1).evaluate(step=5)
    assert {k: v for k, v in first.items() if k in greedy_only} == greedy_only  # the greedy part is unchanged
    assert not any("best@" in key for key in greedy_only)
