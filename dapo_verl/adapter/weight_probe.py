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
  request after each weight push, recording what it returned with its ``global_steps``.

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

__all__ = ["ENGINE_RECORDS", "LOGP_TOLERANCE", "PROBE_PROMPT", "PROBE_SAMPLING", "REFERENCE_RECORDS",
           "append_record", "reference_decode", "weight_sync_check"]

PROBE_PROMPT = list(range(11, 27))
"""16 token ids, valid for any vocabulary of the rehearsal's models, and shared with no chat-templated prompt."""
PROBE_TOKENS = 8
PROBE_SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": PROBE_TOKENS,
                  "ignore_eos": True}
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
        raise ValueError(f"The weights verl sent lack {sorted(set(missing) - tied)[:5]} of the model at "
                         f"{model_path}; the weight-sync probe cannot build a reference.")
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


def weight_sync_check(folder: Path) -> dict[str, Any]:
    """Pair the engine's probes with the references of the pushes before them (see the module docstring).

    Returns:
        ``{"ok", "pushes", "initial", "rows", "reason"}``: ``rows`` has one entry per push -- its
        ``global_steps``, whether the engine's tokens equal the reference's, the largest log-prob difference
        from the reference, and how much the push changed the engine's output (tokens changed, largest
        log-prob change); ``ok`` when every push followed by a request was probed and matched, and at least one
        of them changed the engine's greedy tokens (an update large enough to show that the weights arrive).
    """
    references, engine = _read(folder / REFERENCE_RECORDS), _read(folder / ENGINE_RECORDS)
    if not references:
        return {"ok": False, "pushes": 0, "initial": None, "rows": [],
                "reason": "no weight push was recorded (the probe never ran in the worker that talks to the engine)"}
    initial = next((r for r in engine if r["when"] == "started"), None)
    probes = [r for r in engine if r["when"] == "after_push"]
    rows, previous = [], initial
    for reference in references:
        probe = next((p for p in probes if p["global_steps"] == reference["global_steps"]
                      and p["seq"] > (previous["seq"] if previous else -1)), None)
        if probe is None:
            rows.append({"global_steps": reference["global_steps"], "probed": False})
            continue
        row = {"global_steps": reference["global_steps"], "probed": True,
               "tokens_equal": probe["tokens"] == reference["tokens"],
               "logp_max_diff": _max_diff(probe["log_probs"], reference["log_probs"])}
        if previous is not None:
            row["tokens_changed"] = probe["tokens"] != previous["tokens"]
            row["logp_max_change"] = _max_diff(probe["log_probs"], previous["log_probs"])
        rows.append(row)
        previous = probe
    # The run's last push (after its last step) is followed by no request: nothing can be probed after it.
    last_unfollowed = bool(rows) and not rows[-1]["probed"]
    probed = [r for r in rows if r["probed"]]
    matched = [r for r in probed if r["tokens_equal"] and r["logp_max_diff"] <= LOGP_TOLERANCE]
    unprobed = len(rows) - len(probed) - int(last_unfollowed)
    changed = [r for r in matched if r.get("tokens_changed")]
    ok = bool(changed) and len(matched) == len(probed) and unprobed == 0
    if len(matched) < len(probed) or unprobed:
        reason = (f"{len(probed) - len(matched)} of {len(probed)} probed weight pushes were not followed by an engine "
                  f"output equal to the sent weights', {unprobed} not probed (records: {folder})")
    elif not changed:
        reason = ("no weight push changed the engine's greedy output, so the probe cannot tell whether the weights "
                  "reached it (vLLM started with the actor's weights? verl's default load_format=dummy starts it "
                  "from random ones)")
    else:
        reason = (f"after each of {len(probed)} weight pushes followed by generation the engine's greedy output "
                  f"equalled the sent weights' (log-probs within {max(r['logp_max_diff'] for r in matched):.1e}); "
                  f"{len(changed)} of them changed its output"
                  + ("; the last push, after the last step, was followed by no request" if last_unfollowed else ""))
    return {"ok": ok, "pushes": len(rows), "initial": initial is not None, "rows": rows, "reason": reason}
