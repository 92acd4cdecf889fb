"""Fakes that let verl's legacy ``RayPPOTrainer.fit`` run on CPU without Ray, GPUs or a model.

The contracts follow verl 0.9.1 (see the ``FIT_ON_CPU`` notes): a rollout manager that generates and scores
(scores come from verl's own ``math_dapo`` rule), an actor worker group that computes log-probs and
records every update, and a checkpoint manager. Prompt ``i`` is answered correctly by all, none, or half
of its responses according to ``i % 3``, so every generation round holds all-correct, all-wrong and
mixed groups.
"""

from __future__ import annotations

import os
from pathlib import Path

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

import dapo_verl

CONFIG_DIR = str(Path(dapo_verl.__file__).parent / "configs")
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
        return {"raw_prompt": [{"role": "user", "content": f"q {i % 10}"}], "data_source": "math_dapo",
                "reward_model": {"ground_truth": str(i % 10), "style": "rule"}, "extra_info": {"index": i},
                "index": i, "dummy_tensor": torch.tensor([0], dtype=torch.uint8)}


def compose_config(tmp_path, *overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("dapo_trainer", overrides=[
            "data.train_batch_size=4", "data.max_prompt_length=16", f"data.max_response_length={RESPONSE_LEN}",
            "data.dataloader_num_workers=0", "data.shuffle=False", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.agent.num_workers=1", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "critic.enable=False",
            "reward.reward_model.enable=False", "reward.reward_kwargs.overlong_tokens=2", "trainer.logger=['file']",
            "trainer.use_v1=False",
            "trainer.total_epochs=1", "trainer.n_gpus_per_node=1", "trainer.val_before_train=False",
            "trainer.test_freq=-1", "trainer.save_freq=1", "trainer.resume_mode=auto",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}", *overrides,
        ])


class FakeRolloutManager:
    """Generates "Answer: k" responses; prompt i's responses are right for all, none or half (i % 3)."""

    def __init__(self, tok, *, mixed_prompts: bool = True) -> None:
        self.tok = tok
        self.mixed_prompts = mixed_prompts
        self.calls: list[int] = []

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
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
            tensors={"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
                     "attention_mask": attention, "position_ids": (attention.cumsum(1) - 1).clamp_min(0),
                     "rm_scores": rm_scores},
            non_tensors={"multi_modal_inputs": np.array([{} for _ in range(rows)], dtype=object),
                         "acc": np.array(accs, dtype=object), "score": np.array(scores, dtype=object)},
            meta_info={"timing": {}, "reward_extra_keys": ["acc", "score"]},
        )


class FakeActorWorkerGroup:
    """Log-probs of zero, and a record of every update's uids, accuracies and advantages."""

    def __init__(self) -> None:
        self._dispatch_info: dict = {}
        self.updates: list[dict] = []
        self.saved: list[str] = []
        self.loaded: list[str] = []

    def _query_dispatch_info(self, role):
        return [0]

    def compute_log_prob(self, td):
        ids = td["input_ids"]
        values = torch.zeros(ids.values().shape[0])
        nested = torch.nested.nested_tensor_from_jagged(values, offsets=ids.offsets())
        return tu.get_tensordict({"log_probs": nested, "entropy": nested.clone()},
                                 non_tensor_dict={"metrics": {"mfu": 0.0}})

    def update_actor(self, td):
        self.updates.append({
            "uid": list(td["uid"]), "acc": [bool(a) for a in td["acc"]],
            "advantages": td["advantages"].to_padded_tensor(0.0) if td["advantages"].is_nested else td["advantages"],
            "index": [int(info["index"]) for info in td["extra_info"]],
        })
        return tu.get_tensordict({"dummy": torch.zeros(1)}, non_tensor_dict={"metrics": {"mfu": 0.0, "pg_loss": 0.1}})

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        self.saved.append(local_path)

    def load_checkpoint(self, path, del_local_after_load=False):
        self.loaded.append(path)


class FakeCheckpointManager:
    def __init__(self) -> None:
        self.updates: list = []

    def update_weights(self, global_steps=None):
        self.updates.append(global_steps)

    def sleep_replicas(self):
        pass


def build_trainer(config, dataset_size=24, *, mixed_prompts=True):
    from dapo_verl.adapter.trainer import DapoRayTrainer

    tok = tokenizer()
    dataset = PromptDataset(dataset_size)
    trainer = DapoRayTrainer(
        config=config, tokenizer=tok, processor=None, role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=ResourcePoolManager(resource_pool_spec={"global_pool": [1]},
                                                  mapping={Role.ActorRollout: "global_pool"}),
        train_dataset=dataset, val_dataset=dataset, collate_fn=None,
    )
    trainer.actor_rollout_wg = FakeActorWorkerGroup()
    trainer.async_rollout_manager = FakeRolloutManager(tok, mixed_prompts=mixed_prompts)
    trainer.checkpoint_manager = FakeCheckpointManager()
    for name in ("reward_loop_manager", "llm_server_manager", "teacher_model_manager", "distillation_config"):
        setattr(trainer, name, None)
    trainer.async_rollout_mode = True
    trainer.attach_dynamic_sampling()
    return trainer
