"""STYLE.md §2: the core, config and sampler import no verl, ray, omegaconf, hydra or transformers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

BLOCKED = ["verl", "ray", "omegaconf", "hydra", "transformers"]
PURE_MODULES = [
    "dapo_verl",
    "dapo_verl.core",
    "dapo_verl.config",
    "tools.config_docs",
    "dapo_verl.toy",
    "dapo_verl.data",
    "dapo_verl.report",
    "dapo_verl.lifetime",
    "dapo_verl.files",
]


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_pure_modules_import_with_heavy_packages_blocked():
    result = _run(
        f"""
        import importlib, json, sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {BLOCKED!r}:
                    raise ImportError("blocked for the boundary test: " + name)
        sys.meta_path.insert(0, Block())
        for module in {PURE_MODULES!r}:
            importlib.import_module(module)
        print(json.dumps({{"loaded": sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})}}))
        """
    )
    assert result["loaded"] == []


def test_import_dapo_verl_is_fast_after_torch():
    result = _run(
        """
        import json, time
        import torch
        start = time.perf_counter()
        import dapo_verl
        print(json.dumps({"seconds": time.perf_counter() - start}))
        """
    )
    assert result["seconds"] < 1.0


LOCAL_MODULES = [
    "dapo_verl.local",
    "dapo_verl.local.config",
    "dapo_verl.local.compose",
    "dapo_verl.local.tasks",
    "dapo_verl.local.model",
    "dapo_verl.local.rollout",
    "dapo_verl.local.actor",
    "dapo_verl.local.checkpoint",
    "dapo_verl.local.tracking",
    "dapo_verl.local.plots",
    "dapo_verl.local.files",
    "dapo_verl.local.train",
    "dapo_verl.local.arms",
    "dapo_verl.local.ablation_report",
    "dapo_verl.local.ablate",
    "dapo_verl.local.session",
    "dapo_verl.local.results",
    "dapo_verl.local.warm_start",
    "dapo_verl.local.powered_test",
    "dapo_verl.preflight",
]  # the pre-flight check's verl-free half, which dapo-verl train uses


def test_local_backend_imports_with_verl_and_ray_blocked():
    result = _run(
        f"""
        import importlib, json, sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("verl", "ray"):
                    raise ImportError("blocked for the boundary test: " + name)
        sys.meta_path.insert(0, Block())
        for module in {LOCAL_MODULES!r}:
            importlib.import_module(module)
        print(json.dumps({{"loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("verl", "ray"))}}))
        """
    )
    assert result["loaded"] == []
