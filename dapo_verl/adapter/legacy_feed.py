"""The two objects verl's legacy ``fit`` reads its training batches from, as :class:`~dapo_verl.adapter.trainer.
DapoRayTrainer` replaces them (its module docstring): the prompt stream and the rollout manager that replays what
the batch replenisher already generated.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from verl import DataProto

from dapo_verl.adapter.epochs import epoch_divisor

__all__ = ["ReplayingRolloutManager", "StepStream"]


class StepStream:
    """``fit``'s ``train_dataloader``: one collated prompt batch per training step, one iteration per data pass.

    ``fit`` labels its steps with the loop variable of ``for epoch in range(current_epoch, total_epochs)`` and
    ``training/epoch``; an iteration here ends once the sampler has started a new pass over the prompts, so
    that label follows the sampler's data epochs. The run length is ``trainer.total_training_steps`` (``fit``
    returns after the last step), not a number of epochs. ``len()`` is what ``fit`` divides ``global_steps`` by
    to find the epoch it resumes in; after a resume it is chosen to give the restored sampler's epoch.
    """

    def __init__(self, trainer: Any, steps_per_epoch: int) -> None:  # a DapoRayTrainer
        self._trainer = trainer
        self._len = steps_per_epoch

    def __len__(self) -> int:
        return self._len

    def resume_at(self, global_steps: int, data_epoch: int) -> None:
        """Make ``global_steps // len(self)`` equal ``data_epoch`` (where an integer length allows it)."""
        self._len = epoch_divisor(global_steps, data_epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        stream = self._trainer.sampler.stream
        epoch = stream.epoch
        while True:
            yield self._trainer._next_training_prompts()
            if stream.epoch != epoch:
                return

    def state_dict(self) -> dict[str, Any]:
        """Nothing: the sampler state is saved in its own file (see :data:`SAMPLER_STATE_FILE`)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to restore here; see :meth:`DapoRayTrainer._load_checkpoint`."""


class ReplayingRolloutManager:
    """Rollout manager seen by ``fit``: replays the sampler's responses; validation goes to the real one."""

    def __init__(self, trainer: Any, real: Any) -> None:  # a DapoRayTrainer
        self._trainer = trainer
        self.real = real

    def generate_sequences(self, gen_batch: DataProto) -> DataProto:
        if gen_batch.meta_info.get("validate", False):
            return self.real.generate_sequences(gen_batch)
        return self._trainer._replay_rollout(len(gen_batch))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)
