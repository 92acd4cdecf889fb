"""The resume check of a rehearsal: the step trained again after the resume against the uninterrupted run's.

Everything verl logged for that step is compared except what two processes cannot share (wall times, throughput,
memory, verl's bootstrap estimates) and verl's own state that its checkpoint does not hold. Equal means equal up to
float round-off; the update's statistics (loss, gradient, ratios) may differ where a group's responses arrive in
another order, which :func:`resume_check` tells apart from different data.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["REPLICAS_ROUTE", "STREAMING_TIMES", "resume_check", "resume_verdict"]

# Not comparable between two processes: wall times, throughput and memory; and verl's bootstrap estimates of
# validation best@N/worst@N/maj@N, which resample with a generator whose state depends on earlier calls.
_VOLATILE_PREFIXES = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/")
# verl's own state that its checkpoint does not hold: separate_async's adaptive switch threshold and idle/calm step
# counts start again from the config after a resume (verl 0.9.1 trainer_separate_async.py: set in __init__ at 130,
# adapted at 302-317, never saved), and the switch decision is taken against that threshold. The buffer's own answer
# (separate_async/decision/sampleable_count) is still compared.
_VERL_UNSAVED = (
    "separate_async/switch/",
    "separate_async/decision/remaining",
    "separate_async/decision/should_switch_to_rollout",
    "separate_async/decision/effective_switch_cost",
)
# Float round-off: with several agent-loop workers a group's responses arrive in any order (on vLLM too), which
# reorders floating-point sums in the update; quantities near zero (ratio - 1, ppo_kl) move by ~1e-6.
_REL_TOL, _ABS_TOL = 1e-6, 1e-5
_UPDATE_PREFIXES = ("actor/", "rollout_corr/", "training/rollout_")
_BOOTSTRAPPED = re.compile(r"/(best|worst|maj)@\d+/")


def _is_update_statistic(key: str) -> bool:
    """Statistics of the actor update (loss, gradient, ratios): they depend on how a batch splits into
    micro-batches, which follows the order of each group's responses -- canonical in the legacy trainer, the
    order they finished in under the v1 trainer."""
    return key.startswith(_UPDATE_PREFIXES)


def resume_check(first: dict[int, dict[str, Any]], second: dict[int, dict[str, Any]], step: int) -> dict[str, Any]:
    """Compare step ``step`` of the uninterrupted run with the same step after the resume.

    ``identical``: every compared value equal up to float round-off. ``data_identical``: the same for everything
    but the update statistics (the sampler's decisions, the data, rewards, advantages, validation).
    ``update_max_rel_diff``: the largest relative difference among the update statistics.
    """
    a, b = first.get(step), second.get(step)
    if a is None or b is None:
        return {
            "step": step,
            "compared": 0,
            "identical": False,
            "data_identical": False,
            "update_max_rel_diff": None,
            "differences": ["step missing in one run"],
        }
    keys = sorted(
        k
        for k in set(a) & set(b)
        if not k.startswith(_VOLATILE_PREFIXES + _VERL_UNSAVED) and not _BOOTSTRAPPED.search(k)
    )
    differences, data_differences, update_rel = [], [], 0.0
    for key in keys:
        x, y = a[key], b[key]
        same = x == y or (
            isinstance(x, float) and isinstance(y, float) and math.isclose(x, y, rel_tol=_REL_TOL, abs_tol=_ABS_TOL)
        )
        if same:
            continue
        differences.append(f"{key}: {x} vs {y}")
        if _is_update_statistic(key) and isinstance(x, float) and isinstance(y, float):
            update_rel = max(update_rel, abs(x - y) / max(abs(x), abs(y), 1e-12))
        else:
            data_differences.append(key)
    return {
        "step": step,
        "compared": len(keys),
        "identical": not differences,
        "data_identical": not data_differences,
        "update_max_rel_diff": update_rel,
        "differences": differences,
    }


REPLICAS_ROUTE = (
    "several rollout replicas serve the run -- more fake GPUs, or separate_async lending the trainer's "
    "replica, whose requests are aborted when verl takes it back -- and verl routes by load"
)
STREAMING_TIMES = (
    "algorithm.filter_groups.streaming=true: the batch fills with the groups that finish first, and "
    "which finish first between two polls depends on timing"
)


def resume_verdict(resume: dict[str, Any]) -> str:
    if resume["identical"]:
        return "identical"
    if resume["data_identical"]:
        return (
            f"the sampler's decisions and the data identical, update statistics within "
            f"{resume['update_max_rel_diff']:.1e} relative (a group's responses arrive in any order)"
        )
    why = resume.get("why_not_required") or (REPLICAS_ROUTE if not resume.get("required", True) else "")
    return f"{len(resume['differences'])} differ{f' (not required: {why})' if why else ''}"
