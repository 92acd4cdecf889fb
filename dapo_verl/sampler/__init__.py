"""Dynamic-sampling batch replenisher: engine-agnostic, no verl import (see :mod:`.replenisher`)."""

from dapo_verl.sampler.history import PromptHistory
from dapo_verl.sampler.prediction import SuccessPredictor, informative_probability
from dapo_verl.sampler.replenisher import DROP_REASONS, BatchReplenisher, ShortfallError
from dapo_verl.sampler.sizing import (
    budget_can_fill,
    estimate_sample_size,
    max_request_size,
    predicted_request,
    request_size,
    round_request,
    step_prompt_budget,
    update_keep_rate,
)
from dapo_verl.sampler.stream import PromptScorer, PromptStream
from dapo_verl.sampler.types import GenerateFn, GroupResult, IdentityCodec, PayloadCodec, SampledBatch

__all__ = [
    "DROP_REASONS",
    "BatchReplenisher",
    "GenerateFn",
    "GroupResult",
    "IdentityCodec",
    "PayloadCodec",
    "PromptHistory",
    "PromptScorer",
    "PromptStream",
    "SampledBatch",
    "ShortfallError",
    "SuccessPredictor",
    "budget_can_fill",
    "estimate_sample_size",
    "informative_probability",
    "max_request_size",
    "predicted_request",
    "request_size",
    "round_request",
    "step_prompt_budget",
    "update_keep_rate",
]
