"""TRL's GRPOTrainer on the local backend's default experiment: the comparison row of ``bench_local``.

Runs in its own virtual environment, never in the project's (TRL is an optional dependency of the
benchmark only)::

    python3 -m venv .venv-trl
    .venv-trl/bin/pip install torch==2.13.0 transformers==5.10.4 trl==1.16.0
    PYTHONPATH=. .venv-trl/bin/python -m benchmarks.trl_grpo --seed 0

Same task (copy3, 9,800 training prompts, the same 200 held-out prompts), same initial model and tokenizer
(:func:`dapo_verl.local.model.load_or_build`, same seed), same hyper-parameters as ``dapo-verl train``:
16 prompts x 8 responses per generation, 4 gradient steps of 4 prompts each per generation, AdamW lr 1e-3
(constant, no weight decay), grad clip 1.0, temperature 1.0, clip 0.2 / 0.28, token-level loss
(``loss_type="dapo"``), no KL, rewards +1 / -1 plus the soft overlong punishment (TRL's own
``get_soft_overlong_punishment``, budget 6, buffer 4), one CPU thread. TRL has no dynamic sampling: it
trains on every group. The comparable cost is responses generated per response in a group that dynamic
sampling would keep (its responses' correctness differs; counted by the reward function for each
generation), i.e. the ``generated_per_trained`` of ``dapo-verl train``.
Held-out accuracy is measured by the local backend's own greedy evaluation
(:meth:`dapo_verl.local.rollout.Rollout.evaluate`).

Prints one JSON line with ``generated_per_informative`` (whole run and steps 101-200), the final held-out
accuracy and the time per generation step.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from dapo_verl.config import OverlongConfig
from dapo_verl.local.config import ModelConfig
from dapo_verl.local.model import load_or_build
from dapo_verl.local.rollout import Rollout
from dapo_verl.local.tasks import make_task

PROMPTS_PER_STEP, GROUP_SIZE, MINI_BATCHES, BUDGET, OVERLONG_TOKENS = 16, 8, 4, 6, 4
"""The default local experiment (configs/local.yaml and dapo_verl/local/config.py)."""


def _rewards(answers_by_prompt: dict[str, list[int]], mixed_per_call: list[int]):
    """TRL reward function: +1 if the response starts with the answer's tokens, else -1 (the local verifier).

    Appends to ``mixed_per_call`` the number of groups of G consecutive responses (TRL's layout) whose
    correctness differs, once per generation.
    """

    def correctness(prompts, completions, completion_ids, **kwargs) -> list[float]:
        rewards = []
        for prompt, ids in zip(prompts, completion_ids):
            answer = answers_by_prompt[prompt]
            rewards.append(1.0 if list(ids[: len(answer)]) == answer else -1.0)
        groups = [rewards[i : i + GROUP_SIZE] for i in range(0, len(rewards), GROUP_SIZE)]
        mixed_per_call.append(sum(len(set(group)) > 1 for group in groups))
        return rewards

    return correctness


def _generated_per_informative(mixed: list[int]) -> float | None:
    return round(len(mixed) * PROMPTS_PER_STEP / sum(mixed), 3) if sum(mixed) else None


def run(seed: int, steps: int, cache_dir: Path, out_dir: Path) -> dict:
    """Train with TRL for ``steps`` generation steps and measure; see the module docstring."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.rewards import get_soft_overlong_punishment

    torch.set_num_threads(1)
    task = make_task("copy3", heldout_size=200, seed=seed)
    model, tokenizer, _, _ = load_or_build(
        ModelConfig(), max_positions=task.prompt_length + BUDGET, seed=seed, cache_dir=cache_dir
    )
    mixed: list[int] = []
    answers = {
        p: tokenizer(a, add_special_tokens=False)["input_ids"] for p, a in zip(task.train_prompts, task.train_answers)
    }
    config = GRPOConfig(
        output_dir=str(out_dir),
        seed=seed,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        per_device_train_batch_size=PROMPTS_PER_STEP * GROUP_SIZE // MINI_BATCHES,
        steps_per_generation=MINI_BATCHES,
        gradient_accumulation_steps=1,
        num_iterations=1,
        max_steps=steps * MINI_BATCHES,
        num_generations=GROUP_SIZE,
        max_completion_length=BUDGET,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        learning_rate=1e-3,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        epsilon=0.2,
        epsilon_high=0.28,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=config,
        reward_funcs=[_rewards(answers, mixed), get_soft_overlong_punishment(BUDGET, OVERLONG_TOKENS)],
        train_dataset=Dataset.from_dict({"prompt": task.train_prompts}),
    )
    trainer.remove_callback(PrinterCallback)
    began = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - began
    evaluation = Rollout(
        trainer.model,
        tokenizer,
        task,
        n=GROUP_SIZE,
        temperature=1.0,
        max_response_length=BUDGET,
        overlong=OverlongConfig(overlong_tokens=OVERLONG_TOKENS),
        device=torch.device("cpu"),
    ).evaluate()
    return {
        "strategy": "trl_grpo",
        "trl": _version("trl"),
        "seed": seed,
        "steps": steps,
        "generated_per_trained": _generated_per_informative(mixed),
        "late_generated_per_trained": _generated_per_informative(mixed[steps // 2 :]),
        "informative_groups": sum(mixed),
        "generated_groups": len(mixed) * PROMPTS_PER_STEP,
        "final_accuracy": evaluation["val-core/copy3/acc/mean@1"],
        "final_exact": evaluation["val-aux/copy3/exact/mean@1"],
        "train_s": round(train_s, 2),
        "s_per_step": round(train_s / steps, 4),
    }


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def main(argv: list[str] | None = None) -> int:
    """Run and print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="data.seed: task split, initial model, TRL's seed")
    parser.add_argument("--steps", type=int, default=200, help="generation steps (x4 optimizer steps)")
    parser.add_argument("--cache-dir", type=Path, help="model cache (default: a temporary directory)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trl_grpo_") as tmp:
        line = run(args.seed, args.steps, args.cache_dir or Path(tmp) / "cache", Path(tmp) / "out")
    print(json.dumps({"benchmark": "bench_local", "measurement": "trl_grpo", **line}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
