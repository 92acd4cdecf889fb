"""The one pre-flight check: doctor, rehearse and python -m dapo_verl.main refuse what a run would refuse.

Each refused override below is one that ``dapo-verl train``, verl or the rehearsal refuses at start-up; the
check must name its key on one line and must never print ``[ok]`` for the config. The configs as shipped (every
recipe, ``dapo_trainer`` with no override, the README's ``loss_mode=dapo`` overrides) must pass.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dapo_verl import doctor
from dapo_verl.adapter.engine_ranges import VLLM_CHOICES, engine_problems
from dapo_verl.adapter.preflight import DAPO_ENTRY, VERL_ENTRY, compose_and_check, verl_config_problems
from dapo_verl.cli import main
from dapo_verl.preflight import ConfigRefused
from dapo_verl.rehearsal.run import RehearsalError, RehearsalOptions, compose_recipe, rehearse

pytestmark = pytest.mark.verl

RECIPES = [
    "dapo_qwen2.5_32b",
    "dapo_wo_ds_qwen2.5_32b",
    "dapo_qwen2.5_7b",
    "dapo_qwen2.5_math_1.5b",
    "dapo_clip_ablation_eps_high_0.2",
    "dapo_clip_ablation_eps_high_0.28",
    "dapo_trainer",
]
README = (Path(__file__).parents[2] / "README.md").read_text()


def readme_doctor_overrides() -> list[str]:
    """The overrides of README.md's ``dapo-verl doctor ppo_trainer`` example, as written."""
    block = re.search(r"```bash\n(dapo-verl doctor ppo_trainer .*?)\n```", README, flags=re.S)
    assert block, "README.md lost its `dapo-verl doctor ppo_trainer` example"
    return shlex.split(block.group(1).replace("\\\n", " "))[3:]


MICRO_BATCHES = [
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
]  # docs/rehearse.md's dapo_trainer

# override -> the key the refusal must name (each refused at start-up by train, verl or the rehearsal)
REFUSED = {
    "actor_rollout_ref.actor.policy_loss.loss_mode=dapoo": "actor_rollout_ref.actor.policy_loss.loss_mode",
    "actor_rollout_ref.actor.clip_ratio_hihg=0.3": "actor_rollout_ref.actor.clip_ratio_hihg",
    "+actor_rollout_ref.actor.clip_ratio_hihg=0.3": "actor_rollout_ref.actor.clip_ratio_hihg",
    "+actor_rollout_ref.actor.optim.lrr=1e-6": "actor_rollout_ref.actor.optim.lrr",
    "~data.train_batch_size": "data.train_batch_size",
    "actor_rollout_ref.actor.clip_ratio_low=3": "actor_rollout_ref.actor.clip_ratio_low",
    "actor_rollout_ref.actor.loss_agg_mode=token_mean": "actor_rollout_ref.actor.loss_agg_mode",
    "algorithm.adv_estimator=grpoo": "algorithm.adv_estimator",
    "reward.reward_manager.name=dapo-verl": "reward.reward_manager.name",
    "actor_rollout_ref.rollout.name=vlm": "actor_rollout_ref.rollout.name",
    "trainer.v1.trainer_mode=colocate": "trainer.v1.trainer_mode",
    "actor_rollout_ref.rollout.mode=sync": "actor_rollout_ref.rollout",
    "actor_rollout_ref.rollout.n=1": "actor_rollout_ref.rollout.n",
    "algorithm.filter_groups.metric=accuracy": "algorithm.filter_groups.metric",
    "algorithm.filter_groups.refill=adaptiv": "algorithm.filter_groups.refill",
    "reward.reward_kwargs.overlong_tokens=30000": "reward.reward_kwargs.overlong_tokens",
    "data.max_prompt_length=abc": "data.max_prompt_length",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null": "ppo_micro_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size=8": "ppo_micro_batch_size",
    "trainer.v1.sampler.custom_sampler.name=ReplayBuffer": "trainer.v1.sampler.custom_sampler",
    "data.train_batch_size=[1,": "data.train_batch_size=[1,",
    "actor_rollout_ref=5": "actor_rollout_ref",
    "+reward.reward_kwargs.overlong_tokenss=1024": "reward.reward_kwargs.overlong_tokenss",
    "+trainer.v1.trainerr_mode=sync": "trainer.v1.trainer_mode",  # found by the fuzzer: verl would ignore it
    # rollout engine values vLLM refuses only when verl starts the engine (dapo_verl/adapter/engine_ranges.py)
    "actor_rollout_ref.rollout.gpu_memory_utilization=1.5": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.gpu_memory_utilization=abc": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.max_num_seqs=0": "actor_rollout_ref.rollout.max_num_seqs",
    "actor_rollout_ref.rollout.max_num_seqs=1.5": "actor_rollout_ref.rollout.max_num_seqs",
    "actor_rollout_ref.rollout.max_num_batched_tokens=0": "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.rollout.max_num_batched_tokens=100": "actor_rollout_ref.rollout.max_num_seqs=256",
    "actor_rollout_ref.rollout.max_model_len=1024": "actor_rollout_ref.rollout.max_model_len",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=0": "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.data_parallel_size=0": "actor_rollout_ref.rollout.data_parallel_size",
    "actor_rollout_ref.rollout.dtype=fp16": "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.rollout.logprobs_mode=logprobs": "actor_rollout_ref.rollout.logprobs_mode",
    "actor_rollout_ref.rollout.scheduling_policy=lifo": "actor_rollout_ref.rollout.scheduling_policy",
    "+actor_rollout_ref.rollout.engine_kwargs.vllm.gpu_memory_utilization=2": (
        "actor_rollout_ref.rollout.engine_kwargs.vllm.gpu_memory_utilization"
    ),
}


def _problems(name, *overrides):
    entry = VERL_ENTRY if name == "ppo_trainer" else DAPO_ENTRY
    try:
        compose_and_check(
            lambda: compose_recipe(name, list(overrides))[0], entry_module=entry, unset_env_is_problem=False
        )
    except ConfigRefused as refused:
        return refused.problems
    return []


@pytest.mark.parametrize("name", RECIPES)
def test_every_config_as_shipped_passes(name):
    assert _problems(name) == []


def test_verl_setups_with_the_readme_overrides_and_own_micro_batches_pass():
    assert _problems("dapo_trainer", *MICRO_BATCHES) == []


def test_the_readme_doctor_example_passes_as_written(monkeypatch, capsys):
    overrides = readme_doctor_overrides()
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=dapo" in overrides and len(overrides) >= 10
    monkeypatch.setattr(doctor, "run_checks", lambda: [])  # the plugin checks start a fresh process; not the point
    assert main(["doctor", "ppo_trainer", *overrides]) == 0, capsys.readouterr().out
    assert "passes every check a run makes before it starts" in capsys.readouterr().out


def _without(overrides, *prefixes):
    return [o for o in overrides if not o.startswith(prefixes)]


def test_independent_problems_verl_would_raise_one_at_a_time_are_all_reported():
    # verl's validate_config stops at its first error; each of these three hides the next one there.
    overrides = [
        *_without(
            readme_doctor_overrides(), "actor_rollout_ref.actor.ppo_micro", "actor_rollout_ref.rollout.log_prob_micro"
        ),
        "trainer.n_gpus_per_node=3",
    ]
    problems = _problems("ppo_trainer", *overrides)
    keys = [p.key for p in problems]
    assert keys.count("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") == 1
    assert {"data.train_batch_size", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"} <= set(keys)
    assert len(problems) == 3, [p.message for p in problems]
    batch = next(p.message for p in problems if p.key == "data.train_batch_size")
    assert "multiple of 3" in batch and "actor_rollout_ref.rollout.n" in batch
    # two problems from different checks: the overlong buffer against verl's default budget, and no engine
    problems = _problems(
        "ppo_trainer",
        *_without(readme_doctor_overrides(), "data.max_response_length", "actor_rollout_ref.rollout.name"),
    )
    assert {p.key for p in problems} == {"reward.reward_kwargs.overlong_tokens", "actor_rollout_ref.rollout.name"}


def test_an_error_the_check_cannot_settle_says_that_verls_later_checks_did_not_run():
    from dapo_verl.adapter.preflight_verl import validate_config_problems

    config, _ = compose_recipe(
        "ppo_trainer",
        [
            *readme_doctor_overrides(),
            "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
            "actor_rollout_ref.rollout.temperature=0",
        ],
    )
    problems = validate_config_problems(OmegaConf.create(OmegaConf.to_container(config, resolve=True)))
    assert len(problems) == 1 and "temperature should be greater than 0" in problems[0].message
    assert "stops at this error: run the check again once it is fixed" in problems[0].message


@pytest.mark.parametrize("override", sorted(REFUSED))
def test_the_check_refuses_what_a_run_refuses_naming_the_key(override):
    problems = _problems("dapo_trainer", override)
    assert problems, f"{override} passed"
    assert any(REFUSED[override] in p.message for p in problems), [p.message for p in problems]
    assert all("\n" not in p.message for p in problems)


def test_every_problem_is_reported_at_once_the_refused_overrides_and_the_rest():
    problems = _problems(
        "dapo_qwen2.5_32b",
        "actor_rollout_ref.actor.clip_ratio_hihg=0.3",
        "actor_rollout_ref.actor.policy_loss.loss_mode=dapoo",
        "actor_rollout_ref.rollout.n=1",
    )
    keys = [p.key for p in problems]
    assert (
        keys[0] == "actor_rollout_ref.actor.clip_ratio_hihg"
        and "did you mean actor_rollout_ref.actor.clip_ratio_high?" in problems[0].message
    )
    assert {"actor_rollout_ref.actor.policy_loss.loss_mode", "actor_rollout_ref.rollout.n"} <= set(keys)
    assert "Did you mean dapo?" in next(p.message for p in problems if p.key.endswith("loss_mode"))


def test_an_added_key_of_ones_own_or_a_free_form_section_is_accepted():
    assert (
        _problems(
            "dapo_trainer",
            "++trainer.v1.trainerr_mode=sync",
            "+trainer.my_own_setting=1",
            "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_LOGGING_LEVEL=INFO",
            "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        )
        == []
    )


def test_unset_environment_variables_are_noted_and_refused_only_for_a_real_run():
    config, _ = compose_recipe("dapo_qwen2.5_32b", [])
    dry = verl_config_problems(config, entry_module=DAPO_ENTRY, unset_env_is_problem=False)
    assert dry.problems == [] and any("$DAPO_MODEL_PATH" in note for note in dry.unset)
    real = verl_config_problems(config, entry_module=DAPO_ENTRY, unset_env_is_problem=True)
    assert {p.key for p in real.problems} >= {"actor_rollout_ref.model.path", "data.train_files"}
    assert OmegaConf.select(config, "actor_rollout_ref.model.path", throw_on_resolution_failure=False) is None


def test_doctor_refuses_with_a_non_zero_exit_one_line_per_problem_and_no_ok_for_the_config(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "run_checks", lambda: [])  # the plugin checks start a fresh process; not the point
    code = main(
        [
            "doctor",
            "dapo_qwen2.5_32b",
            "actor_rollout_ref.actor.policy_loss.loss_mode=dapoo",
            "actor_rollout_ref.actor.clip_ratio_hihg=0.3",
        ]
    )
    out = capsys.readouterr().out
    assert code != 0
    failed = [line for line in out.splitlines() if line.startswith("[FAIL] config:")]
    assert len(failed) == 2 and "loss_mode='dapoo'" in out and "clip_ratio_hihg" in out
    assert "[ok] config" not in out and "[ok] algorithm" not in out
    assert "would be refused at start-up: 2 problem(s)" in out


def test_doctor_says_ok_only_for_what_it_checked(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "run_checks", lambda: [])
    assert main(["doctor", "dapo_trainer"]) == 0
    out = capsys.readouterr().out
    assert "[ok] config: dapo_trainer passes: dapo_verl settings, DAPO entry point" in out
    assert "verl's validate_config" in out and "rollout engine settings" in out
    assert "[info] trainer:" in out and "[ok] trainer" not in out  # described, not checked


def test_a_typo_given_to_rehearse_is_one_line_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "rehearsal"
    code = main(["rehearse", "dapo_trainer", "actor_rollout_ref.actor.clip_ratio_hihg=0.3", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.count("\n") == 1 and "did you mean actor_rollout_ref.actor.clip_ratio_high?" in err
    with pytest.raises(ConfigRefused, match="actor_rollout_ref.rollout.n=1"):
        rehearse(
            RehearsalOptions(config_name="dapo_trainer", overrides=("actor_rollout_ref.rollout.n=1",), out_dir=out)
        )
    assert not out.exists()


def test_a_rehearsal_out_on_a_read_only_disk_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    # found by probing on a read-only tmpfs: the OSError from creating --out reached the user as a traceback
    import errno
    import os
    from pathlib import Path

    out = tmp_path / "rehearsal"
    real_mkdir = Path.mkdir

    def mkdir(self, *args, **kwargs):
        if self == out:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(out))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert main(["rehearse", "dapo_trainer", "--engine", "stand-in", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"dapo-verl rehearse: Read-only file system ({out}). Point --out at a writable disk.\n"


@pytest.mark.parametrize("options", [["--nodes", "100"], ["--gpus", "64"], ["--gpus", "13", "--overlap-resume"]])
def test_a_rehearsal_whose_ranks_cannot_fit_in_memory_is_refused_before_anything_starts(tmp_path, capsys, options):
    # found by probing: --nodes 100 started Ray nodes for minutes on a 2-core, 24 GiB machine before memory ran out
    out = tmp_path / "rehearsal"
    assert main(["rehearse", "dapo_trainer", *options, "--engine", "stand-in", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data-parallel rank(s) on the stand-in engine hold at least" in err
    assert "Rehearse with at most" in err and not out.exists()


def test_no_resume_reaches_the_options_and_refuses_overlap_resume_before_anything_starts(tmp_path, capsys, monkeypatch):
    from dapo_verl.rehearsal import run as rehearsal_run

    out = tmp_path / "rehearsal"
    assert main(["rehearse", "dapo_trainer", "--no-resume", "--overlap-resume", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "dapo-verl rehearse: --overlap-resume with --no-resume: there is no resume run to start with the first; "
        "drop one of them.\n"
    )
    assert not out.exists()
    seen = []

    def stop_here(options, **kwargs):
        seen.append(options)
        raise RehearsalError("stop here")

    monkeypatch.setattr(rehearsal_run, "rehearse", stop_here)
    for flags, resume in ((["--no-resume"], False), ([], True)):
        assert main(["rehearse", "dapo_trainer", *flags, "--out", str(out)]) == 2
        assert seen.pop().resume is resume


def test_the_memory_bound_refuses_only_what_cannot_fit(monkeypatch):
    from dapo_verl.rehearsal import run as rehearsal_run
    from dapo_verl.rehearsal.engine import Engine

    pages = 24 * 2**30 // os.sysconf("SC_PAGE_SIZE")  # a 24 GiB machine, as these are
    monkeypatch.setattr(rehearsal_run.os, "sysconf", lambda name: pages if name == "SC_PHYS_PAGES" else 4096)
    fits = [
        RehearsalOptions(config_name="dapo_trainer", out_dir=Path("x"), **kw)
        for kw in ({"nodes": 2}, {"gpus": 2}, {"nodes": 2, "gpus": 2}, {"overlap": True})
    ]
    for options in fits:  # what the tests and the docs rehearse, on either engine
        for engine in Engine:
            rehearsal_run._check_memory(options, engine)
    with pytest.raises(RehearsalError, match=r"8 data-parallel rank\(s\) on the vllm engine hold at least 27 GiB"):
        rehearsal_run._check_memory(
            RehearsalOptions(config_name="dapo_trainer", out_dir=Path("x"), nodes=4, gpus=2), Engine.VLLM
        )


@functools.cache
def _dapo_trainer():
    return compose_recipe("dapo_trainer", [])[0]


def _engine(**rollout):
    """engine_problems of dapo_trainer (vLLM; prompt 512 + response 20480 tokens) with rollout keys replaced."""
    config = copy.deepcopy(_dapo_trainer())
    for key, value in rollout.items():
        OmegaConf.update(config, f"actor_rollout_ref.rollout.{key}", value, force_add=True)
    return [p.message for p in engine_problems(config)]


def test_each_refused_engine_value_is_one_line_with_the_value_vllm_range_and_fix():
    (memory,) = _engine(gpu_memory_utilization=1.5)
    assert memory.startswith(
        "actor_rollout_ref.rollout.gpu_memory_utilization=1.5 is outside vLLM's range 0 < gpu_memory_utilization <= 1"
    )
    assert "Set actor_rollout_ref.rollout.gpu_memory_utilization to a share in (0, 1]" in memory
    (seqs,) = _engine(max_num_seqs=0)
    assert "max_num_seqs=0 is outside vLLM's range max_num_seqs >= 1" in seqs and "to an integer >= 1" in seqs
    (length,) = _engine(max_model_len=1024)
    assert "max_model_len=1024 is below prompt_length + response_length = 512 + 20480 = 20992" in length
    assert (
        "verl caps each response at 1024 tokens of prompt and response, cutting responses short of "
        "response_length=20480"
        in length
        and "max_model_len >= 20992" in length
    )
    (engine,) = _engine(**{"engine_kwargs.vllm.max_model_len": 4096})
    assert (
        engine.startswith("actor_rollout_ref.rollout.engine_kwargs.vllm.max_model_len=4096 is below")
        and "vLLM stops each sequence at 4096 tokens" in engine
    )
    (budget,) = _engine(max_num_batched_tokens=100)
    assert "max_num_batched_tokens=100 is below actor_rollout_ref.rollout.max_num_seqs=256" in budget
    assert "max_num_batched_tokens >= 256 or actor_rollout_ref.rollout.max_num_seqs <= 100" in budget
    (raised,) = _engine(enable_chunked_prefill=False, max_model_len=20992, max_num_seqs=30000)
    assert "(verl raises it to max_model_len=20992 without chunked prefill)" in raised
    (kind,) = _engine(dtype="fp16")
    assert "dtype='fp16' is not one of vLLM's dtype values (auto, half, float16, bfloat16, float, float32)" in kind
    (given,) = _engine(**{"engine_kwargs.vllm.max-num-seqs": "9000"})  # vLLM reads engine_kwargs as text
    assert given.startswith(
        "actor_rollout_ref.rollout.max_num_batched_tokens=8192 is below "
        "actor_rollout_ref.rollout.engine_kwargs.vllm.max-num-seqs='9000'"
    )


def test_engine_values_vllm_accepts_pass_at_the_edges_of_its_ranges():
    assert (
        _engine(
            gpu_memory_utilization=1,
            max_num_seqs=1,
            max_num_batched_tokens=1,
            tensor_model_parallel_size=1,
            max_model_len=20992,
            dtype="auto",
            logprobs_mode=None,
            scheduling_policy="priority",
        )
        == []
    )
    assert _engine(max_num_batched_tokens=256, max_num_seqs=256) == []
    assert _engine(enable_chunked_prefill=False, max_num_batched_tokens=100) == []  # verl raises it to max_model_len
    assert (
        _engine(
            **{
                "engine_kwargs.vllm.gpu_memory_utilization": "0.9",
                "engine_kwargs.vllm.max_num_seqs": None,
                "engine_kwargs.vllm.max_model_len": "32k",
            }
        )
        == []
    )  # text as vLLM parses it; null dropped
    # vLLM's ranges are vLLM's; the length rule holds for every engine (verl caps responses the same way)
    assert _engine(name="sglang", dtype="fp16") == []
    assert len(_engine(name="sglang", max_model_len=1024)) == 1


LENGTH_TEXTS = ["32k", "32K", "25.6k", "2.5K", "auto", "AUTO", "-1", " 21000", "abc", "0.8", "1M", "256", "float32"]

_VLLM_AGREES = (
    f"LENGTH_TEXTS = {LENGTH_TEXTS!r}\n"
    + """
import json, typing
from vllm.config.cache import CacheConfig
from vllm.config.model import LogprobsMode, ModelDType
from vllm.config.parallel import ParallelConfig
from vllm.config.scheduler import SchedulerConfig, SchedulerPolicy

def refused(make):
    try:
        make()
    except ValueError:
        return True
    return False

def readable(text):  # how `vllm serve` reads --max-model-len, or None where it exits
    import argparse
    from vllm.utils.argparse_utils import human_readable_int_or_auto
    try:
        return human_readable_int_or_auto(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError):  # argparse turns each into "invalid value"
        return None

def scheduler(**kw):
    return lambda: SchedulerConfig(max_model_len=4096, is_encoder_decoder=False, enable_chunked_prefill=True, **kw)

print(json.dumps({
    "gpu_memory_utilization": [refused(lambda v=v: CacheConfig(gpu_memory_utilization=v)) for v in (1.5, 0, 1, 0.8)],
    "max_num_seqs": [refused(scheduler(max_num_seqs=v, max_num_batched_tokens=8192)) for v in (0, 1.5, 1, 256)],
    "max_num_batched_tokens": [refused(scheduler(max_num_seqs=1, max_num_batched_tokens=v)) for v in (0, 1)],
    "budget": [refused(scheduler(max_num_seqs=256, max_num_batched_tokens=v)) for v in (100, 256)],
    "tensor_parallel_size": [refused(lambda v=v: ParallelConfig(tensor_parallel_size=v)) for v in (0, 1)],
    "data_parallel_size": [refused(lambda v=v: ParallelConfig(data_parallel_size=v)) for v in (0, 1)],
    "dtype": typing.get_args(ModelDType), "logprobs_mode": typing.get_args(LogprobsMode),
    "scheduling_policy": typing.get_args(SchedulerPolicy),
    "max_model_len": [readable(text) for text in LENGTH_TEXTS],
}))
"""
)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM (the vllm extra) is not installed")
def test_vllm_itself_refuses_what_the_check_refuses_and_accepts_what_it_passes():
    # in a process of its own: importing vLLM sets up its logging and platform for the whole process
    result = subprocess.run([sys.executable, "-c", _VLLM_AGREES], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    vllm = json.loads(result.stdout.strip().splitlines()[-1])
    assert vllm["gpu_memory_utilization"] == [True, True, False, False]
    assert vllm["max_num_seqs"] == [True, True, False, False]
    assert vllm["max_num_batched_tokens"] == [True, False] and vllm["budget"] == [True, False]
    assert vllm["tensor_parallel_size"] == [True, False] and vllm["data_parallel_size"] == [True, False]
    assert {argument: list(known) for argument, (_, known) in VLLM_CHOICES.items()} == {
        argument: vllm[argument] for argument in VLLM_CHOICES
    }
    # the same values, through the check
    assert [bool(_engine(gpu_memory_utilization=v)) for v in (1.5, 0, 1, 0.8)] == vllm["gpu_memory_utilization"]
    assert [bool(_engine(max_num_seqs=v)) for v in (0, 1.5, 1, 256)] == vllm["max_num_seqs"]
    assert [bool(_engine(max_num_seqs=1, max_num_batched_tokens=v)) for v in (0, 1)] == vllm["max_num_batched_tokens"]
    assert [bool(_engine(max_num_batched_tokens=v)) for v in (100, 256)] == vllm["budget"]
    assert [bool(_engine(tensor_model_parallel_size=v)) for v in (0, 1)] == vllm["tensor_parallel_size"]
    assert [bool(_engine(data_parallel_size=v)) for v in (0, 1)] == vllm["data_parallel_size"]
    # engine_kwargs.vllm.max_model_len reaches vLLM as command-line text (found by the engine-value sweep: text vLLM
    # cannot read, or a length below prompt + response, passed the check); -1 / auto is the model's length
    from dapo_verl.adapter.engine_ranges import _readable_length

    assert [_readable_length(text) for text in LENGTH_TEXTS] == vllm["max_model_len"]
    for text, length in zip(LENGTH_TEXTS, vllm["max_model_len"], strict=True):
        problems = _engine(engine_kwargs={"vllm": {"max_model_len": text}})
        refused = length is None or 0 <= length < 512 + 20480
        assert bool(problems) == refused, (text, problems)


def test_doctor_and_rehearse_refuse_engine_values_before_anything_starts(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(doctor, "run_checks", lambda: [])
    code = main(
        [
            "doctor",
            "dapo_trainer",
            "actor_rollout_ref.rollout.gpu_memory_utilization=1.5",
            "actor_rollout_ref.rollout.max_num_seqs=0",
            "actor_rollout_ref.rollout.max_model_len=1024",
        ]
    )
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("[FAIL] config:")]
    assert code != 0 and len(failed) == 3 and "[ok] config" not in out
    assert all(
        f"rollout.{key}" in "".join(failed)
        for key in ("gpu_memory_utilization=1.5", "max_num_seqs=0", "max_model_len=1024")
    )
    out_dir = tmp_path / "rehearsal"
    with pytest.raises(ConfigRefused, match="gpu_memory_utilization=1.5 is outside vLLM's range"):
        rehearse(
            RehearsalOptions(
                config_name="dapo_trainer",
                out_dir=out_dir,
                overrides=("actor_rollout_ref.rollout.gpu_memory_utilization=1.5",),
            )
        )
    assert not out_dir.exists()
