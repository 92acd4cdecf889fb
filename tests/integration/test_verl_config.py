"""verl config dataclasses extended with dapo_verl's keys: instantiation through _target_ and start-up errors."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.verl

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.config import AlgoConfig, FilterGroupsConfig  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from dapo_verl.adapter.verl_config import DapoAlgoConfig, DapoFilterGroupsConfig, extension_keys  # noqa: E402
from dapo_verl.config import SamplerConfig  # noqa: E402

ALGO = "dapo_verl.adapter.verl_config.DapoAlgoConfig"
GROUPS = "dapo_verl.adapter.verl_config.DapoFilterGroupsConfig"


def test_extended_sections_instantiate_through_target_and_stay_verl_dataclasses():
    node = OmegaConf.create(
        {
            "_target_": ALGO,
            "adv_estimator": "dapo",
            "adv_epsilon": 0.01,
            "filter_groups": {"_target_": GROUPS, "surplus": "carry", "metric": "acc"},
        }
    )
    algo = omega_conf_to_dataclass(node)
    assert isinstance(algo, AlgoConfig) and isinstance(algo.filter_groups, FilterGroupsConfig)
    assert algo.adv_epsilon == 0.01 and algo.filter_groups.surplus == "carry"
    assert algo.filter_groups.max_num_gen_batches == 10  # DAPO's default, not verl's unlimited 0


def test_defaults_equal_the_single_home_in_dapo_verl_config():
    groups = DapoFilterGroupsConfig()
    defaults = SamplerConfig()
    for key in ("enable", "metric", "max_num_gen_batches", "refill", "surplus", "max_staleness_steps", "on_shortfall"):
        assert getattr(groups, key) == getattr(defaults, key)
    assert DapoAlgoConfig().adv_epsilon == 1e-6


def test_extension_keys_are_only_the_ones_verl_lacks():
    assert set(extension_keys("algorithm")) == {"adv_epsilon", "group_token_mean", "overlong_filtering"}
    assert "refill" in extension_keys("algorithm.filter_groups")
    assert "enable" not in extension_keys("algorithm.filter_groups")


@pytest.mark.parametrize(
    ("node", "match"),
    [
        ({"_target_": GROUPS, "surplus": "keep"}, r"algorithm.filter_groups.surplus='keep' is not one of"),
        ({"_target_": GROUPS, "max_num_gen_batches": 0}, "max_num_gen_batches=0 must be >= 1"),
        ({"_target_": ALGO, "adv_epsilon": -1.0}, "algorithm.adv_epsilon=-1.0 must be >= 0.0"),
    ],
)
def test_bad_values_fail_when_verl_builds_the_section(node, match):
    with pytest.raises(Exception, match=match):
        omega_conf_to_dataclass(OmegaConf.create(node))
