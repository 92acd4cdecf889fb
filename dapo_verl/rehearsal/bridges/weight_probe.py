"""A rehearsal's check that verl's weight sync reaches vLLM: the engine's greedy output follows the weights sent.

verl's own ``training/rollout_probs_diff_*`` compare the rollout's log-probabilities with the actor's, which
shows the engine samples from the actor's weights only when those weights changed enough to matter; at a
recipe's learning rate (1e-6) they barely move in a few steps. This probe needs no such change:

* **the reference**: each time verl's ``ServerAdapter.update_weights`` pushes weights, the worker that talks to
  the engine keeps the full tensors it sent and greedy-decodes a fixed probe prompt with them in a Hugging Face
  model (:func:`reference_decode`), recording the tokens and their log-probabilities with verl's
  ``global_steps``;
* **the engine**: the vLLM server greedy-decodes the same prompt through its own ``generate`` once when it has
  started (vLLM's initial weights: random with verl's default ``load_format=dummy``) and again before the first
  request after each weight push, recording what it returned with its ``global_steps``. verl may abort the probe
  with the requests in flight; a reply cut short is compared as a prefix of the reference.

:func:`weight_sync_check` pairs them: after every push the engine must return the reference's tokens with
log-probabilities within :data:`LOGP_TOLERANCE`, and the report says how much each push changed the output
(the first push, from vLLM's initial weights, changes it completely). Records are JSON lines in the run's
record folder; the probe's requests are greedy and use a prompt no training request shares.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

__all__ = [
    "ENGINE_RECORDS",
    "LOGP_TOLERANCE",
    "PROBE_PROMPT",
    "PROBE_SAMPLING",
    "REFERENCE_RECORDS",
    "append_record",
    "reference_decode",
    "weight_sync_check",
]

PROBE_PROMPT = list(range(11, 27))
"""16 token ids, valid for any vocabulary of the rehearsal's models, and shared with no chat-templated prompt."""
PROBE_TOKENS = 8
PROBE_SAMPLING = {
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": -1,
    "logprobs": True,
    "max_tokens": PROBE_TOKENS,
    "ignore_eos": True,
}
"""Greedy, a fixed length, with the sampled tokens' log-probabilities (verl's ``generate`` contract)."""
LOGP_TOLERANCE = 1e-3
"""Largest |log p| difference between engine and reference that counts as the same weights (float32 both sides:
~1e-6 is typical)."""

REFERENCE_RECORDS = "weight_sync_reference.jsonl"
ENGINE_RECORDS = "weight_sync_engine.jsonl"


def append_record(folder: Path, file: str, record: dict[str, Any]) -> None:
    """Append one JSON line (one short write: records of concurrent processes never interleave)."""
    folder.mkdir(parents=True, exist_ok=True)
    line = json.dumps({**record, "pid": os.getpid()}) + "\n"
    with open(folder / file, "a") as sink:
        sink.write(line)


_MODELS: dict[str, Any] = {}


def reference_decode(model_path: str, weights: dict[str, Any]) -> dict[str, Any]:
    """Greedy-decode :data:`PROBE_PROMPT` for :data:`PROBE_TOKENS` tokens with ``weights`` loaded into the
    architecture at ``model_path`` (float32, eager attention); return ``{"tokens", "log_probs"}``.

    Raises:
        ValueError: if ``weights`` lack a parameter of the model other than a tied output head.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model = _MODELS.get(model_path)
    if model is None:
        config = AutoConfig.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
        _MODELS[model_path] = model
    missing, _ = model.load_state_dict({k: v.to(torch.float32) for k, v in weights.items()}, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(missing) - tied:
        raise ValueError(
            f"The weights verl sent lack {sorted(set(missing) - tied)[:5]} of the model at "
            f"{model_path}; the weight-sync probe cannot build a reference."
        )
    if tied:
        model.tie_weights()
    tokens, log_probs = [], []
    ids = torch.tensor([PROBE_PROMPT])
    with torch.no_grad():
        for _ in range(PROBE_TOKENS):
            logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), dim=-1)  # (V,)
            token = int(torch.argmax(logp))
            tokens.append(token)
            log_probs.append(float(logp[token]))
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return {"tokens": tokens, "log_probs": log_probs}


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _max_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=math.inf) if len(a) == len(b) else math.inf


def _probe_after(probes: list[dict[str, Any]], global_steps: int, seq: int) -> dict[str, Any] | None:
    """The first probe of ``global_steps``'s weights after ``seq`` that returned a token.

    The probe is a request like any other, so verl can abort it with the rest (colocate_async aborts everything in
    flight once a streaming batch is full): such a reply holds only the tokens decoded before the abort, compared
    below as a prefix of the reference's; one that holds none shows nothing and is passed over.
    """
    return next((p for p in probes if p["global_steps"] == global_steps and p["seq"] > seq and p["tokens"]), None)


def _pair(
    references: list[dict[str, Any]], probes: list[dict[str, Any]], initial: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """One row per push of one replica: the first engine probe after it with its global step, if any."""
    rows, previous, seq = [], initial, initial["seq"] if initial else -1
    for reference in references:
        probe = _probe_after(probes, reference["global_steps"], seq)
        row: dict[str, Any] = {
            "replica": reference.get("replica", 0),
            "global_steps": reference["global_steps"],
            "probed": probe is not None,
        }
        if probe is not None:
            n = len(probe["tokens"])  # PROBE_TOKENS, or fewer when an abort cut the probe short
            row["probe_tokens"] = n
            row["tokens_equal"] = probe["tokens"] == reference["tokens"][:n]
            row["logp_max_diff"] = _max_diff(probe["log_probs"], reference["log_probs"][:n])
            if previous is not None:
                k = min(n, len(previous["tokens"]))
                row["tokens_changed"] = probe["tokens"][:k] != previous["tokens"][:k]
                row["logp_max_change"] = _max_diff(probe["log_probs"][:k], previous["log_probs"][:k])
            previous, seq = probe, probe["seq"]
        rows.append(row)
    return rows


def weight_sync_check(folder: Path) -> dict[str, Any]:
    """Pair each replica's engine probes with the references of the pushes before them (see the module docstring).

    A push is probed when the engine served a request after it and before the next push (the last push of a run,
    after its last step, never is). Returns ``{"ok", "pushes", "initial", "rows", "reason"}``: ``rows`` has one
    entry per push -- replica, ``global_steps``, whether it was probed, whether the engine's tokens equal the
    reference's, the largest log-prob difference from the reference, and how much the push changed the engine's
    output; ``ok`` when every probe matched its reference, every replica was probed, and at least one push changed
    the engine's greedy tokens (an update large enough to show that the weights arrive).
    """
    references, engine = _read(folder / REFERENCE_RECORDS), _read(folder / ENGINE_RECORDS)
    if not references:
        return {
            "ok": False,
            "pushes": 0,
            "initial": False,
            "rows": [],
            "reason": "no weight push was recorded (the probe never ran in the worker that talks to the engine)",
        }
    replicas = sorted({r.get("replica", 0) for r in references})
    rows = []
    for replica in replicas:
        mine = [r for r in engine if r.get("replica", 0) == replica]
        initial = next((r for r in mine if r["when"] == "started"), None)
        rows += _pair(
            [r for r in references if r.get("replica", 0) == replica],
            [r for r in mine if r["when"] == "after_push"],
            initial,
        )
    probed = [r for r in rows if r["probed"]]
    matched = [r for r in probed if r["tokens_equal"] and r["logp_max_diff"] <= LOGP_TOLERANCE]
    unprobed_replicas = sorted(set(replicas) - {r["replica"] for r in probed})
    changed = [r for r in matched if r.get("tokens_changed")]
    ok = bool(changed) and len(matched) == len(probed) and not unprobed_replicas
    if len(matched) < len(probed) or unprobed_replicas:
        reason = (
            f"{len(probed) - len(matched)} of {len(probed)} probed weight pushes were not followed by an engine "
            f"output equal to the sent weights'; replicas never probed: {unprobed_replicas} (records: {folder})"
        )
    elif not changed:
        reason = (
            "no weight push changed the engine's greedy output, so the probe cannot tell whether the weights "
            "reached it (vLLM started with the actor's weights? verl's default load_format=dummy starts it "
            "from random ones)"
        )
    else:
        reason = (
            f"after each of {len(probed)} weight pushes followed by generation ({len(replicas)} "
            f"replica{'s' if len(replicas) > 1 else ''}) the engine's greedy output equalled the sent weights' "
            f"(log-probs within {max(r['logp_max_diff'] for r in matched):.1e}); {len(changed)} of them changed "
            f"its output; {len(rows) - len(probed)} push(es) had no request after them before the next push "
            f"or the end of the run"
        )
    return {
        "ok": ok,
        "pushes": len(rows),
        "initial": any(r["when"] == "started" for r in engine),
        "rows": rows,
        "reason": reason,
    }
