"""Registration reaches verl in a fresh process through the entry point, and the loud fallbacks work."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.verl

from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER  # noqa: E402
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_adv_estimator_fn, get_policy_loss_fn  # noqa: E402

from dapo_verl import doctor  # noqa: E402
from dapo_verl.adapter import register  # noqa: E402

PROBE = textwrap.dedent(
    """
    import json
    {setup}
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
    print(json.dumps({{
        "loss": getattr(POLICY_LOSS_REGISTRY.get("dapo"), "__module__", None),
        "adv": getattr(ADV_ESTIMATOR_REGISTRY.get("dapo"), "__module__", None),
        "reward": getattr(REWARD_MANAGER.get("dapo_verl"), "__module__", None),
        "dapo_imported_before_verl": {imported_before},
    }}))
    """
)


def _probe(setup="import verl", env=None, imported_before="False"):
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(setup=setup, imported_before=imported_before)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
    )
    return result


def test_import_verl_alone_registers_everything_in_a_fresh_process():
    result = _probe("import sys\nimport verl\nbefore = 'dapo_verl' in sys.modules", imported_before="before")
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {
        "loss": "dapo_verl.adapter.losses",
        "adv": "dapo_verl.adapter.advantages",
        "reward": "dapo_verl.adapter.reward",
        "dapo_imported_before_verl": True,
    }


@pytest.mark.slow
def test_plugins_disabled_means_nothing_registered():
    result = _probe(env={"VERL_USE_EXTERNAL_PLUGINS": "none"})
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["loss"] is None and seen["adv"] is None and seen["reward"] is None


@pytest.mark.slow
def test_verl_use_external_modules_fallback_registers_loudly():
    env = {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "dapo_verl.adapter.register"}
    seen = json.loads(_probe(env=env).stdout.strip().splitlines()[-1])
    assert seen["loss"] == "dapo_verl.adapter.losses" and seen["reward"] == "dapo_verl.adapter.reward"
    broken = _probe(env={"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "dapo_verl.no_such"})
    assert broken.returncode != 0 and "dapo_verl.no_such" in broken.stderr


@pytest.mark.slow
def test_external_lib_fallback_registers_in_model_config():
    setup = textwrap.dedent(
        """
        import verl
        from verl.workers.config import HFModelConfig
        try:
            HFModelConfig(path="/nonexistent-model", external_lib="dapo_verl.adapter.register")
        except Exception:
            pass  # the model path is invalid here; the external_lib import happens first
        """
    )
    seen = json.loads(_probe(setup, env={"VERL_USE_EXTERNAL_PLUGINS": "none"}).stdout.strip().splitlines()[-1])
    assert seen["loss"] == "dapo_verl.adapter.losses"


def test_registration_is_idempotent_and_visible_through_verl_getters():
    importlib.reload(register)
    register.register()
    assert get_policy_loss_fn("dapo").__qualname__ == "compute_policy_loss_dapo"
    assert get_adv_estimator_fn("dapo").__qualname__ == "compute_dapo_outcome_advantage"
    assert REWARD_MANAGER["dapo_verl"].__qualname__ == "DapoRewardManager"
    assert all(register.registration_status().values())


def test_a_foreign_object_under_our_name_is_refused_not_replaced():
    original = POLICY_LOSS_REGISTRY["dapo"]

    def impostor(**kwargs):
        return None

    POLICY_LOSS_REGISTRY["dapo"] = impostor
    try:
        with pytest.raises(ValueError, match="verl already has a policy loss named 'dapo'.*will not replace it"):
            register.register()
        assert POLICY_LOSS_REGISTRY["dapo"] is impostor
    finally:
        POLICY_LOSS_REGISTRY["dapo"] = original


def test_doctor_names_match_the_registered_names():
    assert doctor._NAMES == (register.POLICY_LOSS_NAME, register.ADV_ESTIMATOR_NAME, register.REWARD_MANAGER_NAME)


@pytest.mark.slow
def test_doctor_command_reports_health_and_the_fix():
    healthy = subprocess.run(
        [sys.executable, "-m", "dapo_verl.cli", "doctor"], capture_output=True, text=True, check=False
    )
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "verl sees dapo_verl." in healthy.stdout
    broken = subprocess.run(
        [sys.executable, "-m", "dapo_verl.cli", "doctor"],
        capture_output=True,
        text=True,
        env={**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "none"},
        check=False,
    )
    assert broken.returncode == 1
    assert "VERL_USE_EXTERNAL_MODULES=dapo_verl.adapter.register" in broken.stdout
