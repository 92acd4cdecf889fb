"""The data the sampler exchanges with a backend: generated groups, training batches, callbacks.

Shape legend: G responses per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["GenerateFn", "GroupResult", "IdentityCodec", "PayloadCodec", "SampledBatch"]


@dataclass(frozen=True)
class GroupResult:
    """One prompt's G responses as the generate callback reports them.

    Attributes:
        prompt_id: Index of the prompt in the prompt source.
        metric: (G,) bool/int/float. The filter metric of each response -- raw correctness (``acc``).
        response_lengths: (G,) integer. Valid tokens of each response.
        truncated: (G,) bool. True for responses cut off at the generation budget.
        scores: (G,) float, optional. The (possibly length-shaped) reward, logged before filtering.
        payload: Backend data for the group (token ids, log-probs, a verl ``DataProto`` slice, ...). The
            sampler never looks inside it; it only stores it while the group is carried over.
    """

    prompt_id: int
    metric: Tensor
    response_lengths: Tensor
    truncated: Tensor
    scores: Tensor | None = None
    payload: Any = None

    @property
    def group_size(self) -> int:
        """G, the number of responses."""
        return int(self.metric.shape[0])

    @property
    def num_tokens(self) -> int:
        """Total response tokens generated for this group."""
        return int(self.response_lengths.sum())


class GenerateFn(Protocol):
    """Generate G responses for each prompt id and score them.

    Must return one :class:`GroupResult` per id, in the order of ``prompt_ids``.
    """

    def __call__(self, prompt_ids: Sequence[int]) -> Sequence[GroupResult]: ...


class PayloadCodec(Protocol):
    """Turns a group's payload into checkpointable data and back.

    ``encode`` must return nested dicts/lists of tensors, str, int, float, bool and None only, so the
    sampler state can be saved as JSON plus safetensors and loaded without executing anything.
    """

    def encode(self, payload: Any) -> Any: ...

    def decode(self, data: Any) -> Any: ...


class IdentityCodec:
    """Codec for payloads that already are plain data (e.g. a dict of tensors)."""

    def encode(self, payload: Any) -> Any:
        return payload

    def decode(self, data: Any) -> Any:
        return data


@dataclass
class SampledBatch:
    """One training step's worth of informative groups.

    Attributes:
        groups: The groups to train on, in order: carried-over groups first (oldest first), then new ones.
            Exactly ``train_batch_size`` unless ``is_partial``.
        metrics: Step metrics, ``dapo/sampler/...`` keys (see :class:`~dapo_verl.sampler.BatchReplenisher`).
        step: The training step this batch is for (1-based).
        is_partial: True when the round limit was reached and ``on_shortfall=partial`` let a short batch
            through.
    """

    groups: list[GroupResult]
    metrics: dict[str, float] = field(default_factory=dict)
    step: int = 0
    is_partial: bool = False

    @property
    def num_responses(self) -> int:
        """Responses in the batch (sum of group sizes)."""
        return sum(g.group_size for g in self.groups)

    def stacked_metric(self) -> Tensor:
        """(P, G) filter metric of the batch's groups (for checks and logging)."""
        if not self.groups:
            return torch.zeros(0, 0)
        return torch.stack([g.metric.to(torch.float32) for g in self.groups])
