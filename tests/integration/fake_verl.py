"""Fakes that let verl's legacy ``RayPPOTrainer.fit`` run on CPU without Ray, GPUs or a model.

Why fakes here, when ``tests/e2e/test_rehearse_*.py`` run verl's real trainer: these tests drive ``fit``
through dozens of steps and corner cases (hopeless data, planted pickles, exact resume of carried groups) in
seconds, and look at every update's uids and advantages, which a real run does not expose.

The contracts follow verl 0.9.1 (see the ``FIT_ON_CPU`` notes), as strictly as verl enforces them: the
rollout manager splits each request over its agent-loop workers with ``DataProto.chunk`` (which refuses an
uneven split) and refuses to generate while the replicas are asleep (between ``sleep_replicas`` and the next
``update_weights``); the actor worker group reports 2 data-parallel ranks, so ``fit`` balances every batch over
them, and refuses an update that does not split into whole mini-batches on both ranks, as verl's worker does.
Scores come from verl's own ``math_dapo`` rule. Prompt ``i`` is answered correctly by all, none, or half of its
responses according to ``i % 3``, so every generation round holds all-correct, all-wrong and mixed groups.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast
from verl import DataProto
from verl.single_controller.ray.base import ResourcePoolManager
from verl.trainer.ppo.utils import Role
from verl.utils import tensordict_utils as tu
from verl.utils.reward_score import default_compute_score

from dapo_verl.config import CONFIG_DIR as PACKAGE_CONFIGS

CONFIG_DIR = str(PACKAGE_CONFIGS)
PROMPT_LEN, RESPONSE_LEN = 4, 6
WORDS = ["<pad>", "<eos>", "<unk>", "Answer:", "q", "the", *[str(i) for i in range(10)]]


def tokenizer() -> PreTrainedTokenizerFast:
    core = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return tok


class PromptDataset(torch.utils.data.Dataset):
    """Rows shaped like verl's RLHFDataset items; prompt i asks for the answer i % 10."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        return {
            "raw_prompt": [{"role": "user", "content": f"q {i % 10}"}],
            "data_source": "math_dapo",
            "reward_model": {"ground_truth": str(i % 10), "style": "rule"},
            "extra_info": {"index": i},
            "index": i,
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
        }


def compose_config(tmp_path, *overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(
            "dapo_trainer",
            overrides=[
                "data.train_batch_size=4",
                "data.max_prompt_length=16",
                f"data.max_response_length={RESPONSE_LEN}",
                "data.dataloader_num_workers=0",
                "data.shuffle=False",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.rollout.agent.num_workers=2",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                "critic.enable=False",
                "reward.reward_model.enable=False",
                "reward.reward_kwargs.overlong_tokens=2",
                "trainer.logger=['file']",
                "trainer.use_v1=False",
                "trainer.total_epochs=1",
                "trainer.n_gpus_per_node=1",
                "trainer.val_before_train=False",
                "trainer.test_freq=-1",
                "trainer.save_freq=1",
                "trainer.resume_mode=auto",
                f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                *overrides,
            ],
        )


class ReplicaState:
    """Whether the rollout replicas hold their weights: put to sleep by ``fit``, woken by the weight update."""

    def __init__(self) -> None:
        self.awake = False  # verl's init_workers leaves the replicas asleep until the first update_weights


class FakeRolloutManager:
    """Generates "Answer: k" responses; prompt i's responses are right for all, none or half (i % 3)."""

    def __init__(self, tok, state: ReplicaState, *, workers: int = 2, mixed_prompts: bool = True) -> None:
        self.tok = tok
        self.state = state
        self.agent_loop_workers = [object()] * workers
        self.mixed_prompts = mixed_prompts
        self.calls: list[int] = []

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
        if not self.state.awake:
            raise RuntimeError("generate_sequences while the rollout replicas are asleep")
        gen_batch.chunk(len(self.agent_loop_workers))  # verl's agent-loop manager: refuses an uneven split
        rows = len(gen_batch)
        self.calls.append(rows)
        prompts = torch.full((rows, PROMPT_LEN), self.tok.pad_token_id)
        responses = torch.full((rows, RESPONSE_LEN), self.tok.pad_token_id)
        scores, accs = [], []
        for r in range(rows):
            index = int(gen_batch.non_tensor_batch["index"][r])
            truth = gen_batch.non_tensor_batch["reward_model"][r]["ground_truth"]
            right = index % 3 == 0 or (self.mixed_prompts and index % 3 == 2 and r % 2 == 0)
            answer = truth if right else str((int(truth) + 1) % 10)
            ids = self.tok(f"Answer: {answer}")["input_ids"] + [self.tok.eos_token_id]
            responses[r, : len(ids)] = torch.tensor(ids)
            prompts[r, -2:] = torch.tensor(self.tok(f"q {truth}")["input_ids"])
            result = default_compute_score("math_dapo", f"Answer: {answer}", truth)
            scores.append(result["score"])
            accs.append(result["acc"])
        attention = torch.cat([prompts != self.tok.pad_token_id, responses != self.tok.pad_token_id], dim=1).long()
        rm_scores = torch.zeros(rows, RESPONSE_LEN)
        rm_scores[torch.arange(rows), attention[:, PROMPT_LEN:].sum(-1) - 1] = torch.tensor(scores)
        return DataProto.from_dict(
            tensors={
                "prompts": prompts,
                "responses": responses,
                "input_ids": torch.cat([prompts, responses], 1),
                "attention_mask": attention,
                "position_ids": (attention.cumsum(1) - 1).clamp_min(0),
                "rm_scores": rm_scores,
            },
            non_tensors={
                "multi_modal_inputs": np.array([{} for _ in range(rows)], dtype=object),
                "acc": np.array(accs, dtype=object),
                "score": np.array(scores, dtype=object),
            },
            meta_info={"timing": {}, "reward_extra_keys": ["acc", "score"]},
        )


class FakeActorWorkerGroup:
    """Log-probs of zero, and a record of every update's uids, accuracies and advantages."""

    DP_RANKS = 2

    def __init__(self, log_prob_micro_batch_size_per_gpu: int | None = None) -> None:
        self.log_prob_micro = log_prob_micro_batch_size_per_gpu  # None: verl's dynamic batch size
        self._dispatch_info: dict = {}
        self.updates: list[dict] = []
        self.saved: list[str] = []
        self.loaded: list[str] = []

    def _query_dispatch_info(self, role):
        return list(range(self.DP_RANKS))  # the data-parallel rank of each worker

    def compute_log_prob(self, td):
        rows = td.batch_size[0]
        if rows % self.DP_RANKS or (self.log_prob_micro and (rows // self.DP_RANKS) % self.log_prob_micro):
            raise AssertionError(
                f"{rows} rows do not split into micro-batches of {self.log_prob_micro} on "
                f"{self.DP_RANKS} ranks (verl's prepare_micro_batches asserts the same)"
            )
        ids = td["input_ids"]
        values = torch.zeros(ids.values().shape[0])
        nested = torch.nested.nested_tensor_from_jagged(values, offsets=ids.offsets())
        return tu.get_tensordict(
            {"log_probs": nested, "entropy": nested.clone()}, non_tensor_dict={"metrics": {"mfu": 0.0}}
        )

    def update_actor(self, td):
        rows, mini = td.batch_size[0], tu.get_non_tensor_data(td, "mini_batch_size", None)
        if rows % self.DP_RANKS or mini % self.DP_RANKS or (rows // self.DP_RANKS) % (mini // self.DP_RANKS):
            raise AssertionError(
                f"{rows} rows do not split into mini-batches of {mini} on {self.DP_RANKS} ranks "
                f"(verl's make_iterator asserts the same)"
            )
        self.updates.append(
            {
                "uid": list(td["uid"]),
                "acc": [bool(a) for a in td["acc"]],
                "advantages": td["advantages"].to_padded_tensor(0.0)
                if td["advantages"].is_nested
                else td["advantages"],
                "index": [int(info["index"]) for info in td["extra_info"]],
            }
        )
        return tu.get_tensordict({"dummy": torch.zeros(1)}, non_tensor_dict={"metrics": {"mfu": 0.0, "pg_loss": 0.1}})

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        self.saved.append(local_path)

    def load_checkpoint(self, path, del_local_after_load=False):
        self.loaded.append(path)


class FakeCheckpointManager:
    def __init__(self, state: ReplicaState) -> None:
        self.state = state
        self.updates: list = []

    def update_weights(self, global_steps=None):
        self.updates.append(global_steps)
        self.state.awake = True

    def sleep_replicas(self):
        self.state.awake = False


def build_trainer(config, dataset_size=24, *, mixed_prompts=True):
    from dapo_verl.adapter.trainer import DapoRayTrainer

    tok = tokenizer()
    dataset = PromptDataset(dataset_size)
    trainer = DapoRayTrainer(
        config=config,
        tokenizer=tok,
        processor=None,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=ResourcePoolManager(
            resource_pool_spec={"global_pool": [1]}, mapping={Role.ActorRollout: "global_pool"}
        ),
        train_dataset=dataset,
        val_dataset=dataset,
        collate_fn=None,
    )
    state = ReplicaState()
    rollout = config.actor_rollout_ref.rollout
    trainer.actor_rollout_wg = FakeActorWorkerGroup(
        None if rollout.log_prob_use_dynamic_bsz else rollout.log_prob_micro_batch_size_per_gpu
    )
    trainer.async_rollout_manager = FakeRolloutManager(
        tok, state, workers=config.actor_rollout_ref.rollout.agent.num_workers, mixed_prompts=mixed_prompts
    )
    trainer.checkpoint_manager = FakeCheckpointManager(state)
    for name in ("reward_loop_manager", "llm_server_manager", "teacher_model_manager", "distillation_config"):
        setattr(trainer, name, None)
    trainer.async_rollout_mode = True
    trainer.attach_dynamic_sampling()
    return trainer
