"""Which keys a rehearsal changes, and to what: only scale, hardware and engine; never the algorithm.

:func:`rehearsal_changes` reads the recipe's composed config and returns one :class:`Change` per key the
rehearsal must set to run on one CPU machine, each with the reason. Everything not listed -- the loss and its
clip range, the estimator, the reward manager and its overlong shaping (rescaled to the shorter responses),
dynamic sampling and its limits, group size, optimiser, schedule, checkpoint and validation cadence,
logging backends that need no network -- stays the recipe's own.

The changes fall in five groups:

* **Model**: the recipe's model cannot be loaded here, so a tiny stand-in (:mod:`.stand_in`) takes its place
  unless ``actor_rollout_ref.model.path`` already points at a small local model; attention falls back to
  ``eager`` (flash-attention is CUDA-only).
* **Scale**: batch sizes shrink keeping the recipe's ratios (generation batch / train batch, mini-batches
  per step as far as the smaller batch allows); sequence lengths shrink to what the rehearsal data needs, and
  every length-derived budget (token limits per GPU, overlong buffer) keeps its ratio to them.
* **Hardware**: ``nodes`` nodes (one by default), ``gpus`` fake GPUs (CPU processes) each, no
  tensor/sequence/pipeline parallelism, float32. On one node the run starts a private Ray cluster through
  ``ray_kwargs.ray_init``; on several, the runs are jobs on a running cluster and ``ray_kwargs`` stays the recipe's.
  FSDP1 is replaced by FSDP2, because FSDP1 requires CUDA (``sync_module_states``).
* **Engine**: with vLLM's CPU build installed, ``rollout.name`` stays ``vllm`` and verl runs its own vLLM rollout;
  only what a CPU cannot do changes -- float32, eager mode (no CUDA graphs), sleep mode and ``free_cache_engine``
  off -- and the engine's token and sequence budgets (``max_model_len``, ``max_num_batched_tokens``,
  ``max_num_seqs``) shrink by the factor the sequence lengths shrink by, so their relations to each other and to
  the prompt and response lengths stay the recipe's. Otherwise ``rollout.name=dapo_cpu``
  (:mod:`dapo_verl.rehearsal.bridges.cpu_rollout`) stands in for vLLM. Either way weights sync as full tensors
  (``checkpoint_engine.backend=naive``), verl's rollout-versus-actor metrics are on
  (``rollout.calculate_log_probs``), and one agent-loop worker runs unless the command line asks for more (each
  worker is a process of its own, and start-up is most of a rehearsal's time on 2 cores).
* **Run**: the rehearsal's data files, step count, checkpoint cadence and directories (on several nodes the
  recipe's own checkpoint folder when it lies under ``DAPO_OUTPUT_DIR``); logging to JSONL (``file``) in addition
  to the recipe's offline loggers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dapo_verl.rehearsal.bridges.response_lengths import length_shape
from dapo_verl.rehearsal.changes import Change, Planner, RehearsalShape, select

__all__ = ["ONLINE_LOGGERS", "Change", "RehearsalShape", "override_keys", "rehearsal_changes", "select"]

ONLINE_LOGGERS = ("wandb", "swanlab", "mlflow", "vemlp_wandb", "clearml", "trackio", "rl_insight")
"""Tracking backends that need a network or an account; a rehearsal drops them and says so."""


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, max(1, min(n, limit)) + 1) if n % d == 0)


_SEQUENCES_PER_MICRO_BATCH = 16  # one rollout group (n=16) per micro-batch on the paper recipes
_FLOAT32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}


def _scaled_tokens(value: Any, old_total: int, new_total: int) -> int | None:
    """A per-GPU token budget scaled by new_total / old_total, holding at least a few full sequences.

    The floor of :data:`_SEQUENCES_PER_MICRO_BATCH` sequences keeps the number of micro-batches (each with a
    fixed FSDP cost on CPU) small; it changes how a mini-batch is split, never the loss (token-mean over the
    mini-batch).
    """
    if not isinstance(value, int) or value <= 0:
        return None
    return max(_SEQUENCES_PER_MICRO_BATCH * new_total, math.ceil(value * new_total / max(old_total, 1)))


def _model(p: Planner, shape: RehearsalShape) -> None:
    if shape.model_replaced:
        p.set(
            "actor_rollout_ref.model.path",
            shape.model_path,
            "stand-in: tiny qwen2 model with Qwen2.5's chat format, built in code",
            "model",
        )
    p.set(
        "actor_rollout_ref.model.override_config.attn_implementation", "eager", "flash-attention is CUDA-only", "model"
    )


def _scale(p: Planner, shape: RehearsalShape) -> None:
    old_train = int(p.get("data.train_batch_size"))
    new_train = min(old_train, shape.train_batch_size)
    p.set("data.train_batch_size", new_train, "prompt groups per step", "scale")
    gen = p.get("data.gen_batch_size")
    if isinstance(gen, int):
        p.set(
            "data.gen_batch_size",
            max(new_train, round(gen * new_train / old_train)),
            f"keeps the recipe's {gen / old_train:g} x train_batch_size",
            "scale",
        )
    for section in ("actor_rollout_ref.actor", "critic"):
        mini = p.get(f"{section}.ppo_mini_batch_size")
        if isinstance(mini, int) and (section != "critic" or p.get("critic.enable")):
            steps = max(1, old_train // max(mini, 1))
            p.set(
                f"{section}.ppo_mini_batch_size",
                _largest_divisor_at_most(new_train, max(1, new_train // steps)),
                f"the recipe takes {steps} gradient steps per step, the rehearsal as many as {new_train} prompts allow",
                "scale",
            )
    for key in (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
        "critic.ppo_micro_batch_size_per_gpu",
    ):
        value = p.get(key)
        if isinstance(value, int) and value > 8:
            p.set(key, 8, "micro-batch", "scale")
    val_n = p.get("actor_rollout_ref.rollout.val_kwargs.n")
    if isinstance(val_n, int) and val_n > 2:
        p.set("actor_rollout_ref.rollout.val_kwargs.n", 2, "validation samples per prompt", "scale")
    _lengths(p, shape)


def _lengths_given_fit(p: Planner, shape: RehearsalShape, prompt: int, response: int) -> bool:
    """Whether lengths given with the overrides fit the rehearsal model's context (``max_position_embeddings``).

    Sizes given on the command line are kept, but a user's usual ``data.max_response_length=20480`` is a cluster
    value that neither the stand-in's 4096 positions nor a CPU can hold: such lengths are scaled like the recipe's.
    """
    given = {"data.max_prompt_length", "data.max_response_length"} & p.user_keys
    return not given or shape.max_positions is None or prompt + response <= shape.max_positions


def _lengths(p: Planner, shape: RehearsalShape) -> None:
    old_prompt = int(p.get("data.max_prompt_length"))
    old_response = int(p.get("data.max_response_length"))
    new_prompt = min(old_prompt, shape.max_prompt_length)
    new_response = min(old_response, shape.max_response_length)
    fit = _lengths_given_fit(p, shape, old_prompt, old_response)
    given = (
        ""
        if fit
        else (
            f"; the given {old_prompt} + {old_response} tokens exceed the model's "
            f"{shape.max_positions} positions, so they count as a cluster value"
        )
    )
    p.set(
        "data.max_prompt_length",
        new_prompt,
        "the longest rehearsal prompt, rounded up to 64" + given,
        "scale",
        keep_given=fit,
    )
    p.set("data.max_response_length", new_response, "response budget" + given, "scale", keep_given=fit)
    old_total, new_total = old_prompt + old_response, new_prompt + new_response
    for key in (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
        "critic.ppo_max_token_len_per_gpu",
    ):
        scaled = _scaled_tokens(p.get(key), old_total, new_total)
        if scaled is not None:
            p.set(key, scaled, f"follows the sequence length ({old_total} -> {new_total} tokens)", "scale")
    # The engine's budgets: one factor for all three keeps max_model_len >= prompt + response and
    # max_num_batched_tokens >= max_num_seqs as in the recipe (ceil preserves both).
    for key in (
        "actor_rollout_ref.rollout.max_model_len",
        "actor_rollout_ref.rollout.max_num_batched_tokens",
        "actor_rollout_ref.rollout.max_num_seqs",
    ):
        value = p.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            p.set(
                key,
                math.ceil(value * new_total / old_total),
                f"the engine's budget, scaled as the sequence length ({old_total} -> {new_total} tokens)",
                "scale",
            )
    for key in ("reward.reward_kwargs.overlong_tokens", "reward.reward_kwargs.overlong_buffer_cfg.len"):
        value = p.get(key)
        if not isinstance(value, int) or value <= 0:
            continue
        scaled = max(1, min(new_response, round(value * new_response / old_response)))
        if key in p.user_keys and value > new_response:  # a cluster value given with the recipe's overrides
            p.set(
                key,
                scaled,
                f"the given {value} exceeds the rehearsal's {new_response}-token responses; scaled as "
                f"max_response_length ({old_response} -> {new_response})",
                "scale",
                keep_given=False,
            )
        else:
            p.set(
                key, scaled, f"the recipe's overlong buffer, {value / old_response:.0%} of max_response_length", "scale"
            )


def _hardware(p: Planner, shape: RehearsalShape) -> None:
    p.set(
        "trainer.nnodes",
        shape.nodes,
        "one machine" if shape.nodes == 1 else f"{shape.nodes} Ray nodes on this machine",
        "hardware",
    )
    p.set("trainer.n_gpus_per_node", shape.gpus, "fake GPUs: one CPU process each", "hardware")
    p.set("trainer.device", "cpu", "no GPU", "hardware")
    for role in ("actor", "ref"):
        base = f"actor_rollout_ref.{role}"
        if p.get(f"{base}.strategy") == "fsdp":
            p.set(f"{base}.strategy", "fsdp2", "FSDP1 needs CUDA (sync_module_states); FSDP2 runs on CPU", "hardware")
        # verl computes in bfloat16 (autocast and FSDP's param dtype) unless mixed_precision says otherwise;
        # CPUs without bfloat16 units emulate it slowly, and float32 lets the rollout and actor log-probs agree.
        if isinstance(p.get(f"{base}.fsdp_config"), dict):
            p.set(
                f"{base}.fsdp_config.mixed_precision",
                dict(_FLOAT32),
                "float32 compute: bfloat16 is slow on CPU",
                "hardware",
            )
        p.set(
            f"{base}.fsdp_config.dtype",
            "float32",
            "float32 compute: bfloat16 is slow on CPU",
            "hardware",
            only_if_declared=True,
        )
        p.set(f"{base}.fsdp_config.model_dtype", "fp32", "float32 weights", "hardware", only_if_declared=True)
        p.set(
            f"{base}.fsdp_config.use_torch_compile",
            False,
            "no compiler for CPU here",
            "hardware",
            only_if_declared=True,
        )
        if (p.get(f"{base}.fsdp_config.ulysses_sequence_parallel_size") or 1) > 1:
            p.set(f"{base}.fsdp_config.ulysses_sequence_parallel_size", 1, "no sequence parallelism", "hardware")
        if (p.get(f"{base}.ulysses_sequence_parallel_size") or 1) > 1:
            p.set(f"{base}.ulysses_sequence_parallel_size", 1, "no sequence parallelism", "hardware")
    for key in (
        "tensor_model_parallel_size",
        "data_parallel_size",
        "pipeline_model_parallel_size",
        "expert_parallel_size",
    ):
        value = p.get(f"actor_rollout_ref.rollout.{key}")
        if isinstance(value, int) and value > 1:
            p.set(
                f"actor_rollout_ref.rollout.{key}",
                1,
                "one CPU process per engine: no model parallelism on CPU",
                "hardware",
            )


def _separate(p: Planner) -> bool:
    """Whether the recipe runs v1's ``separate_async`` (its rollout on a pool of its own)."""
    return bool(p.get("trainer.use_v1", True)) and p.get("trainer.v1.trainer_mode") == "separate_async"


def _ray(p: Planner, shape: RehearsalShape) -> None:
    if shape.nodes > 1:  # a job joins the running cluster with the recipe's own ray_init, as on a real cluster
        return
    # Ray counts only GPU/NPU resources for placement (the cpu platform names GPU), so fake GPUs satisfy it.
    rollout_pool = 0
    if _separate(p):  # the standalone rollout pool: one fake GPU of its own
        p.set("actor_rollout_ref.rollout.nnodes", 1, "the standalone rollout pool on this machine", "hardware")
        p.set("actor_rollout_ref.rollout.n_gpus_per_node", 1, "one rollout engine process (a fake GPU)", "hardware")
        rollout_pool = 1
    p.set("ray_kwargs.ray_init.num_gpus", shape.gpus + rollout_pool, "fake GPUs for Ray's placement", "hardware")
    p.set("ray_kwargs.ray_init.num_cpus", 16, "logical CPUs for verl's actors (they mostly wait)", "hardware")
    p.set(
        "ray_kwargs.ray_init._temp_dir",
        shape.ray_temp_dir,
        "a private Ray cluster, started and stopped here",
        "hardware",
    )
    p.set("ray_kwargs.ray_init.include_dashboard", False, "no dashboard", "hardware")


_VLLM_ON_CPU = (
    (
        "dtype",
        "float32",
        "bfloat16 is slow on CPUs without AVX-512-BF16; float32 on both sides lets vLLM's log-probs match the actor's",
    ),
    ("enforce_eager", True, "CUDA graphs need a GPU"),
    ("free_cache_engine", False, "sleep mode releases GPU memory through CUDA's allocator, which a CPU lacks"),
    ("enable_sleep_mode", False, "sleep mode needs CUDA (vLLM's CuMemAllocator)"),
    # The rehearsal seeds each request (rehearsal/bridges/request_seeds.py); after a partial prefill vLLM rewinds a
    # seeded request's generator with Generator.set_offset (v1/worker/gpu_model_runner.py:3750 in vLLM 0.27).
    (
        "enable_chunked_prefill",
        False,
        "vLLM rewinds a seeded request's random generator after a partial prefill, "
        "which CPU generators cannot (no offset); the rehearsal seeds every request",
    ),
)


def _engine(p: Planner, shape: RehearsalShape) -> None:
    if shape.engine == "vllm":
        p.set("actor_rollout_ref.rollout.name", "vllm", "verl's own vLLM rollout, on vLLM's CPU build", "engine")
        for key, value, reason in _VLLM_ON_CPU:
            p.set(f"actor_rollout_ref.rollout.{key}", value, reason, "engine")
        _whole_prefills_fit(p)
        if length_shape(p.config.actor_rollout_ref.rollout) is not None:  # long_tail (checked before planning)
            p.set(
                "actor_rollout_ref.rollout.logprobs_mode",
                "raw_logprobs",
                "long_tail lengths mask EOS before a "
                "request's drawn length (min_tokens), which vLLM's processed log-probs include; the raw ones are the "
                "model's own, as the actor computes them at temperature 1",
                "engine",
            )
    else:
        p.set("actor_rollout_ref.rollout.name", "dapo_cpu", "CPU rollout replica in place of vLLM", "engine")
    p.set(
        "actor_rollout_ref.rollout.calculate_log_probs",
        True,
        "verl's rollout-versus-actor metrics (training/rollout_probs_diff_*) for the report",
        "engine",
    )
    p.set("actor_rollout_ref.rollout.mode", "async", "verl 0.9 serves rollouts asynchronously", "engine")
    if _separate(p):
        p.set(
            "actor_rollout_ref.rollout.checkpoint_engine.backend",
            "dapo_zmq",
            "nccl, hccl, nixl, mooncake and "
            "kimi need GPUs or RDMA: a rehearsal-only transport over TCP sockets between processes",
            "engine",
        )
    else:
        p.set(
            "actor_rollout_ref.rollout.checkpoint_engine.backend",
            "naive",
            "full-tensor weight sync in process",
            "engine",
        )
    workers = p.get("actor_rollout_ref.rollout.agent.num_workers")
    if isinstance(workers, int) and workers > 1:
        p.set(
            "actor_rollout_ref.rollout.agent.num_workers",
            1,
            "one agent-loop process (each takes ~10 s to start)",
            "engine",
            user_wins=True,
        )
    reward_workers = p.get("reward.num_workers")
    if isinstance(reward_workers, int) and reward_workers > 1:
        p.set("reward.num_workers", 1, "one reward worker", "engine")
    units = p.get("transfer_queue.backend.SimpleStorage.num_data_storage_units")
    if isinstance(units, int) and units > 1:
        p.set("transfer_queue.backend.SimpleStorage.num_data_storage_units", 1, "one storage unit", "engine")
    if (p.get("data.dataloader_num_workers") or 0) > 0:
        p.set("data.dataloader_num_workers", 0, "load data in the trainer process", "engine")


def _whole_prefills_fit(p: Planner) -> None:
    """Without chunked prefill vLLM needs ``max_num_batched_tokens >= max_model_len``.

    A recipe that leaves ``max_model_len`` unset gets the model's context length (verl reads
    ``max_position_embeddings``: 131072 for Qwen2.5-32B, 4096 for the stand-in); the rehearsal's sequences need
    prompt + response tokens, so that is what it sets. A budget below it (a recipe relying on chunking) is raised
    to the smallest one that runs.
    """
    rollout = "actor_rollout_ref.rollout"
    sequence = _value(p, "data.max_prompt_length") + _value(p, "data.max_response_length")
    if p.get(f"{rollout}.max_model_len") is None:
        p.set(
            f"{rollout}.max_model_len",
            sequence,
            "unset: the model's context length; the rehearsal's sequences "
            "need prompt + response tokens (the budget below must hold it, chunked prefill being off)",
            "scale",
        )
    budget = p.changes.get(f"{rollout}.max_num_batched_tokens")
    tokens = budget.rehearsal if budget else p.get(f"{rollout}.max_num_batched_tokens")
    longest = _value(p, f"{rollout}.max_model_len")
    if isinstance(tokens, int) and tokens < longest:
        p.set(
            f"{rollout}.max_num_batched_tokens",
            longest,
            "without chunked prefill a whole prompt and response must fit one scheduler step (max_model_len)",
            "engine",
        )


def _value(p: Planner, key: str) -> int:
    change = p.changes.get(key)
    return int(change.rehearsal if change else p.get(key))


def _run(p: Planner, shape: RehearsalShape) -> None:
    p.set("data.train_files", shape.train_file, "rehearsal data", "run")
    p.set("data.val_files", shape.val_file, "rehearsal data", "run")
    p.set("trainer.total_training_steps", shape.steps, "rehearsal length", "run")
    p.set("trainer.save_freq", max(1, shape.steps - 1), "checkpoint before the last step, to resume from it", "run")
    if shape.nodes == 1 or not _under_output_dir(p, "trainer.default_local_dir"):
        p.set("trainer.default_local_dir", shape.checkpoint_dir, "rehearsal output", "run")
    p.set("trainer.resume_mode", "disable", "the first run starts fresh", "run")
    loggers = p.get("trainer.logger") or []
    loggers = [loggers] if isinstance(loggers, str) else list(loggers)
    kept = [name for name in loggers if name not in ONLINE_LOGGERS]
    if "file" not in kept:
        kept.append("file")
    if kept != loggers:
        dropped = [name for name in loggers if name in ONLINE_LOGGERS]
        reason = "JSONL metrics for the report" + (f"; {', '.join(dropped)} need a network" if dropped else "")
        p.set("trainer.logger", kept, reason, "run")
    for key in ("trainer.rollout_data_dir", "trainer.validation_data_dir"):
        if p.get(key):
            p.set(key, f"{shape.checkpoint_dir}/../{key.rsplit('.', 1)[1]}", "rehearsal output", "run")


def _under_output_dir(p: Planner, key: str) -> bool:
    """Whether the recipe's ``key`` is written under ``${oc.env:DAPO_OUTPUT_DIR...}`` (a job's documented paths)."""
    parent, _, leaf = key.rpartition(".")
    node = p.config
    for part in parent.split("."):
        node = node.get(part) if isinstance(node, DictConfig) else None
    raw = OmegaConf.to_container(node, resolve=False).get(leaf) if isinstance(node, DictConfig) else None
    return isinstance(raw, str) and "DAPO_OUTPUT_DIR" in raw


def override_keys(overrides: Sequence[str]) -> frozenset[str]:
    """The keys a list of Hydra overrides sets (``+``, ``++`` and ``~`` prefixes removed).

    Example:
        >>> sorted(override_keys(["+a.b=1", "c=[1,2]", "~d"]))
        ['a.b', 'c', 'd']
    """
    return frozenset(item.lstrip("+~").split("=", 1)[0] for item in overrides)


def rehearsal_changes(
    config: DictConfig, shape: RehearsalShape, user_keys: frozenset[str] = frozenset()
) -> list[Change]:
    """Every key the rehearsal sets, in the order above (see the module docstring).

    Scale keys the user set on the command line (``user_keys``) are kept as given: a size chosen for the
    rehearsal is the user's to choose, and so is the number of agent-loop workers. Model, hardware, other engine
    and run keys change whatever was given.
    """
    planner = Planner(config, user_keys)
    _model(planner, shape)
    _scale(planner, shape)
    _hardware(planner, shape)
    _ray(planner, shape)
    _engine(planner, shape)
    _run(planner, shape)
    return list(planner.changes.values())
