"""A CPU rollout replica for verl: stands in for vLLM in a rehearsal, through verl's own rollout seams.

verl reaches a rollout engine in two places, and this module fills both:

* **Replica and server** (``RolloutReplicaRegistry``, a public registry): :class:`CpuRolloutReplica` starts one
  :class:`CpuRolloutServer` Ray actor per replica. The agent loop sends it token-in/token-out ``generate``
  requests exactly as it sends them to vLLM's server; the server samples with Hugging Face forward passes
  (KV cache, temperature, top-k, top-p) and returns verl's ``TokenOutput`` with the sampled tokens'
  log-probabilities (``log_softmax(logits / temperature)``, the quantity verl's actor recomputes).
* **In-worker adapter** (``verl.workers.rollout.base._ROLLOUT_REGISTRY``, a private dict -- the only way to
  add a rollout class in verl 0.9.1): :class:`CpuServerAdapter` lives in each actor worker. verl calls its
  ``update_weights`` with the FSDP-gathered full tensors after every step (``checkpoint_engine.backend=naive``)
  and its ``resume``/``release`` to wake the server and put it to sleep.

The server is as strict as a colocated vLLM engine: it refuses to generate while asleep (weights or KV
cache released), refuses weights with unknown names or shapes, and reports the step of the weights it holds
(``extra_fields["global_steps"]``), which verl's v1 trainer uses for staleness. It aborts as vLLM's server does
(``abort_all_requests``: what is generating stops between two tokens and returns what it holds with
``stop_reason="aborted"``; new requests wait behind the closed gate, or fail with ``reject_request``, until
``resume_generation``), so verl's partial-rollout client and dapo_verl's streaming sampler run on it as on vLLM.

Response lengths: by default the stand-in model decides (it rarely emits EOS, so nearly every response runs to
the budget); ``actor_rollout_ref.rollout.engine_kwargs.dapo_cpu.response_lengths=long_tail`` draws DAPO-like
lengths instead (:mod:`.response_lengths`): EOS is kept out of the sampling before a request's drawn length and
taken at it. The reported log-probabilities stay the model's own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Generator
from typing import Any

import ray
import torch
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from dapo_verl.rehearsal.bridges.request_seeds import RequestSeeds
from dapo_verl.rehearsal.bridges.response_lengths import length_shape, target_length

__all__ = [
    "CPU_ROLLOUT_NAME",
    "CpuRolloutReplica",
    "CpuRolloutServer",
    "CpuServerAdapter",
    "ReplicaAsleepError",
    "sample_next_token",
    "server_actor_name",
]

logger = logging.getLogger(__name__)

CPU_ROLLOUT_NAME = "dapo_cpu"
"""``actor_rollout_ref.rollout.name`` of the CPU replica."""


class ReplicaAsleepError(RuntimeError):
    """A generate request reached a replica whose weights or KV cache were released."""


def server_actor_name(replica_rank: int, node_rank: int = 0) -> str:
    """Ray actor name of a replica's server, shared by the replica (creates it) and the adapter (finds it)."""
    return f"{CPU_ROLLOUT_NAME}_server_{replica_rank}_{node_rank}"


def sample_next_token(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator,
    banned: frozenset[int] = frozenset(),
) -> tuple[int, float]:
    """Sample one token from (V,) logits; return it and its log-probability under ``logits / temperature``.

    ``temperature <= 0`` is greedy (log-probability under the unscaled logits). ``top_k <= 0`` and
    ``top_p >= 1`` disable those filters; they shape the sampling distribution only, as in vLLM, and so do
    ``banned`` tokens, which are never drawn (their log-probabilities stay the model's).
    """
    logits = logits.to(torch.float32)
    if banned:
        full, logits = logits, logits.clone()
        logits[list(banned)] = float("-inf")
        token, _ = sample_next_token(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        scale = temperature if temperature > 0 else 1.0
        return token, float(torch.log_softmax(full / scale, dim=-1)[token])
    if temperature <= 0:
        token = int(torch.argmax(logits))
        return token, float(torch.log_softmax(logits, dim=-1)[token])
    scaled = logits / temperature  # (V,)
    logp = torch.log_softmax(scaled, dim=-1)
    filtered = scaled.clone()
    if 0 < top_k < filtered.numel():
        threshold = torch.topk(filtered, top_k).values[-1]
        filtered[filtered < threshold] = float("-inf")
    if top_p < 1.0:
        order = torch.argsort(filtered, descending=True)
        cumulative = torch.cumsum(torch.softmax(filtered[order], dim=-1), dim=-1)
        cut = cumulative - torch.softmax(filtered[order], dim=-1) >= top_p  # keep the smallest prefix >= top_p
        filtered[order[cut]] = float("-inf")
    token = int(torch.multinomial(torch.softmax(filtered, dim=-1), 1, generator=generator))
    return token, float(logp[token])


class CpuRolloutServer:
    """One replica's generation server (a Ray actor); see the module docstring.

    Args:
        config: verl's rollout config (``response_length``, ``prompt_length``, ``free_cache_engine``, ...).
        model_config: verl's model config; the model is loaded from ``local_path`` in float32.
        replica_rank: This replica's rank, also the seed offset of its sampler.
    """

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig
        from verl.utils.config import omega_conf_to_dataclass

        torch.set_num_threads(1)
        self.config = omega_conf_to_dataclass(config, dataclass_type=RolloutConfig)
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.replica_rank = replica_rank
        path = model_config.local_path
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
        self.model.eval()
        self._names = {name: tuple(t.shape) for name, t in self.model.state_dict().items()}
        eos = GenerationConfig.from_model_config(self.model.config).eos_token_id
        if eos is None:
            eos = model_config.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.awake = {"weights": True, "kv_cache": True}
        self.global_steps: int | None = None
        self.weight_updates = 0
        self.generated = 0
        self._lock = threading.Lock()
        self._seeds = RequestSeeds(int(getattr(self.config, "seed", 0) or 0))
        self._lengths = length_shape(self.config)
        self._open = asyncio.Event()  # the gate: closed between abort_all_requests and resume_generation
        self._open.set()
        self._aborting = threading.Event()  # seen by the sampling thread between two tokens
        self._rejecting = False
        self._running = 0

    # -- generation -----------------------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Token-in/token-out generation, the contract of vLLM's server ``generate``."""
        if image_data is not None or video_data is not None:
            raise NotImplementedError(
                "The CPU rollout replica generates text only; this request carries images "
                "or video, which a rehearsal cannot check."
            )
        while not self._open.is_set():  # parked behind the gate, as vLLM parks requests after an abort
            if self._rejecting:
                raise RuntimeError(
                    f"Rollout replica {self.replica_rank} refused request {request_id}: generation "
                    f"is paused with reject_request=True."
                )
            await self._open.wait()
        asleep = [tag for tag, on in self.awake.items() if not on]
        if asleep:
            raise ReplicaAsleepError(
                f"Rollout replica {self.replica_rank} got a generate request ({request_id}) while its "
                f"{' and '.join(asleep)} {'are' if len(asleep) > 1 else 'is'} released (asleep). A colocated vLLM "
                f"engine would fail here too: generation must happen after the weight update and before sleep."
            )
        params = dict(sampling_params)
        prompt_length, response_length = self.config.prompt_length, self.config.response_length
        budget = self.config.max_model_len or (prompt_length + response_length)
        default = min(response_length, prompt_length + response_length - len(prompt_ids))
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", default))
        max_tokens = max(1, min(int(max_tokens), budget - len(prompt_ids)))
        self._running += 1
        try:
            return await asyncio.to_thread(self._sample, list(prompt_ids), params, max_tokens)
        finally:
            self._running -= 1

    @torch.no_grad()
    def _sample(self, prompt_ids: list[int], params: dict[str, Any], max_tokens: int) -> TokenOutput:
        temperature = float(params.get("temperature", 1.0))
        top_k = int(params.get("top_k", -1) or -1)
        top_p = float(params.get("top_p", 1.0) or 1.0)
        ignore_eos = bool(params.get("ignore_eos", False))
        with self._lock:
            # Seeded by content, so a resumed run regenerates the same groups whatever order requests arrive in.
            seed = self._seeds.next(prompt_ids, params, self.global_steps)
            generator = torch.Generator().manual_seed(seed)
            target = self._target_length(prompt_ids, seed)
            tokens, logps = [], []
            input_ids = torch.tensor([prompt_ids])
            past, stop = None, "completed"
            for _ in range(max_tokens):
                if self._aborting.is_set():
                    stop = "aborted"
                    break
                out = self.model(input_ids=input_ids, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits, early = out.logits[0, -1], target is not None and len(tokens) + 1 < target
                if target is not None and len(tokens) + 1 == target and not ignore_eos:  # the drawn length: EOS
                    eos = min(self.eos_ids)
                    scaled = logits.to(torch.float32) / (temperature if temperature > 0 else 1.0)
                    token, logp = eos, float(torch.log_softmax(scaled, dim=-1)[eos])
                else:
                    token, logp = sample_next_token(
                        logits,
                        temperature=temperature,
                        top_k=top_k,
                        top_p=top_p,
                        generator=generator,
                        banned=frozenset(self.eos_ids) if early else frozenset(),
                    )
                tokens.append(token)
                logps.append(logp)
                if token in self.eos_ids and not ignore_eos:
                    break
                input_ids = torch.tensor([[token]])
            self.generated += 1
        return TokenOutput(
            token_ids=tokens,
            log_probs=logps if params.get("logprobs") else None,
            stop_reason=stop,
            extra_fields={"global_steps": self.global_steps},
        )

    def _target_length(self, prompt_ids: list[int], seed: int) -> int | None:
        """The response length drawn for this request (``long_tail``), or None when the model decides."""
        return None if self._lengths is None else target_length(self._lengths, prompt_ids, seed)

    # -- weights and memory ---------------------------------------------------------------------------

    async def update_weights(self, weights: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load full tensors sent by the actor; return how many were loaded.

        Raises:
            ReplicaAsleepError: if the weights are released (verl resumes them before updating).
            ValueError: for a name the model does not have or a shape that differs.
        """
        if not self.awake["weights"]:
            raise ReplicaAsleepError(
                f"Rollout replica {self.replica_rank} got a weight update while its weights "
                f"are released; verl resumes them (tags=['weights']) first."
            )
        unknown = sorted(set(weights) - set(self._names))
        wrong = sorted(k for k, t in weights.items() if k in self._names and tuple(t.shape) != self._names[k])
        if unknown or wrong:
            raise ValueError(
                f"Weight update for replica {self.replica_rank} does not match its model: unknown "
                f"names {unknown[:5]}, wrong shapes {wrong[:5]}."
            )
        with self._lock:
            self.model.load_state_dict(weights, strict=False)
            if global_steps is not None:
                self.global_steps = global_steps
            self._seeds.restart()  # new weights: a new sampling stream
            self.weight_updates += 1
        return len(weights)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        for tag in tags or list(self.awake):
            self.awake[tag] = True

    async def sleep(self) -> None:
        if self.config.free_cache_engine:
            self.awake = dict.fromkeys(self.awake, False)

    async def release_kv_cache(self) -> None:
        if self.config.free_cache_engine:
            self.awake["kv_cache"] = False

    async def resume_kv_cache(self) -> None:
        self.awake["kv_cache"] = True

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def status(self) -> dict[str, Any]:
        """What a test asks the server: awake tags, weight updates received, responses generated, step."""
        return {
            "awake": dict(self.awake),
            "weight_updates": self.weight_updates,
            "generated": self.generated,
            "global_steps": self.global_steps,
            "checksum": float(sum(p.double().sum() for p in self.model.parameters())),
        }

    async def clear_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> dict:
        """vLLM's ``pause_generation(wait_for_inflight_requests=False)``: close the gate, stop what is generating
        between two tokens, and return once every running request has returned what it held."""
        self._open.clear()
        self._rejecting = reject_request
        aborted = self._running
        self._aborting.set()
        while self._running:
            await asyncio.sleep(0.01)
        return {"aborted_count": aborted, "request_ids": []}

    async def abort_request(self, request_id: str, reset_prefix_cache: bool = True) -> dict:
        return {"aborted": False, "request_id": request_id}  # requests are not tracked one by one

    async def resume_generation(self) -> None:
        """Open the gate again: parked requests generate."""
        self._aborting.clear()
        self._rejecting = False
        self._open.set()

    async def wait_for_requests_to_drain(self) -> None:
        while self._running:
            await asyncio.sleep(0.01)

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class CpuRolloutReplica(RolloutReplica):
    """verl rollout replica ``dapo_cpu``: one :class:`CpuRolloutServer` per replica, on the workers' node."""

    async def launch_servers(self) -> None:
        if self.nnodes != 1:
            raise ValueError(
                f"The CPU rollout replica runs on one node; this replica spans {self.nnodes} "
                f"(tensor_model_parallel_size x data_parallel_size = {self.world_size})."
            )
        server_cls = ray.remote(CpuRolloutServer)
        server = server_cls.options(
            name=server_actor_name(self.replica_rank), max_concurrency=self.max_concurrency, num_cpus=0
        ).remote(self.config, self.model_config, self.replica_rank)
        self.servers = [server]
        await server.status.remote()  # wait until the model is loaded
        self._server_handle = server
        self._server_address = server_actor_name(self.replica_rank)


def _full_cpu_tensor(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu", copy=True)


class CpuServerAdapter(BaseRollout):
    """The rollout object inside each actor worker: forwards wake/sleep and weight updates to its server."""

    def __init__(
        self, config: RolloutConfig, model_config: HFModelConfig, device_mesh: Any, replica_rank: int = -1
    ) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ["RANK"])
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.has_server = rank % world == 0
        self._server: Any = None

    def _handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        if self.config.free_cache_engine and self.has_server:
            await self._handle().wake_up.remote(tags=tags)

    async def release(self) -> None:
        if self.config.free_cache_engine and self.has_server:
            await self._handle().sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(
                f"The CPU rollout replica takes full tensors (wire_format='named_tensors'), "
                f"not {wire_format!r}; use actor_rollout_ref.rollout.checkpoint_engine."
                f"backend=naive."
            )
        # Every rank drains the generator: FSDP gathers the full tensors collectively.
        state = {name: _full_cpu_tensor(tensor) for name, tensor in weights}
        if self.has_server:
            await self._handle().update_weights.remote(state, global_steps)
