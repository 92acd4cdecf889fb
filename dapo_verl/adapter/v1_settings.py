"""What verl's v1 trainer modes allow of dapo_verl's sampler settings, checked when the replay buffer is built.

:class:`~dapo_verl.adapter.v1_sampler.DapoReplayBuffer` calls both checks in its constructor, so a config verl
would run wrongly is refused before the first step with one line naming the keys and the fix.
"""

from __future__ import annotations

from dapo_verl.config import SamplerConfig, SurplusPolicy

__all__ = ["check_off_policy_span", "check_streaming"]


def check_streaming(trainer_mode: str, sampler: SamplerConfig) -> None:
    """Refuse ``streaming`` where verl's trainer cannot stream as the sampler needs (docs/verl.md, Streaming)."""
    if not sampler.streaming:
        return
    key = "algorithm.filter_groups.streaming"
    if trainer_mode == "separate_async":
        raise ValueError(
            f"{key}=true is not available in trainer.v1.trainer_mode=separate_async: there the next "
            f"step's first round generates while this step trains (prefetch), and streaming is "
            f"built for sync and colocate_async. Set {key}=false or use another trainer mode."
        )
    if trainer_mode == "colocate_async" and sampler.surplus != SurplusPolicy.CARRY:
        raise ValueError(
            f"{key}=true with algorithm.filter_groups.surplus={sampler.surplus} in colocate_async: "
            f"verl continues every request still generating after the weight update, so what the "
            f"batch does not need cannot be discarded there. Set surplus=carry (what verl's own "
            f"colocate_async does), or use trainer_mode=sync to discard it."
        )


def check_off_policy_span(trainer_mode: str, sampler: SamplerConfig, threshold: int | None, *, prefetch: bool) -> None:
    """Refuse settings under which a served group could span more policy versions than verl allows.

    verl counts a group's span as ``global_steps - (step it was submitted in) + 1`` and, in its async modes,
    never serves one above ``trainer.v1.sampler.max_off_policy_threshold`` (sync mode is on-policy in verl, which
    ignores the threshold there). Ours: 1, plus ``max_staleness_steps`` with ``surplus=carry``, plus 1 for the
    prefetched round in ``separate_async`` (``prefetch``).
    """
    carry = sampler.surplus == SurplusPolicy.CARRY
    span = 1 + (sampler.max_staleness_steps if carry else 0) + int(prefetch)
    if trainer_mode == "sync" or threshold is None or span <= threshold:
        return
    parts = ["1"]
    fixes = [f"raise the threshold to {span}"]
    if carry:
        parts.append(f"algorithm.filter_groups.max_staleness_steps={sampler.max_staleness_steps} (surplus=carry)")
        fixes.append("lower max_staleness_steps or set surplus=discard")
    if prefetch:
        parts.append("1 (the round generated while the previous step trained)")
        fixes.append("set trainer.v1.sampler.sampler_kwargs.prefetch=false")
    raise ValueError(
        f"trainer.v1.sampler.max_off_policy_threshold={threshold}, but dapo_verl's sampler can serve "
        f"groups spanning {span} policy versions in {trainer_mode}: {' + '.join(parts)}. "
        f"{'; or '.join(fixes).capitalize()}."
    )
