"""``dapo-verl doctor``'s verl version check is dapo-verl's own requirement on verl, judged as ``pip check`` judges it.

The installed verl version is monkeypatched; the requirement is read from the installed metadata, and compared
with pyproject.toml's and with pip's own conflict check over the same metadata.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

from dapo_verl import doctor

VERSIONS = ["0.9.0", "0.9.1", "0.9.2", "0.10.0.dev0", "0.10.0", "1.0"]
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _pyproject_verl() -> Requirement:
    tomllib = pytest.importorskip("tomllib")
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (verl,) = [req for req in map(Requirement, dependencies) if req.name == "verl"]
    return verl


def _doctor_with_verl(monkeypatch, installed: str) -> doctor.Check:
    real_version = doctor.version
    monkeypatch.setattr(doctor, "version", lambda name: installed if name == "verl" else real_version(name))
    return doctor._verl_version()


def _pip_flags(installed: str) -> bool:
    """Whether pip's own check (``pip check``'s code) reports installed verl as a conflict of dapo-verl."""
    check = pytest.importorskip("pip._internal.operations.check")
    from pip._internal.metadata import get_default_environment
    from pip._vendor.packaging.version import Version as PipVersion

    ours = get_default_environment().get_distribution(doctor.DISTRIBUTION)
    assert ours is not None, "dapo-verl is not installed; pip install -e . first"
    package_set = {
        "dapo-verl": check.PackageDetails(ours.version, list(ours.iter_dependencies())),
        "verl": check.PackageDetails(PipVersion(installed), []),
    }
    _, conflicting = check.check_package_set(package_set, should_ignore=lambda name: name != "dapo-verl")
    return any(name == "verl" for name, _, _ in conflicting.get("dapo-verl", []))


@pytest.mark.parametrize("installed", VERSIONS)
def test_doctors_verdict_is_pips_verdict(monkeypatch, installed):
    assert _doctor_with_verl(monkeypatch, installed).ok is not _pip_flags(installed)


@pytest.mark.parametrize("installed", VERSIONS)
def test_doctors_verdict_is_packagings_verdict_on_the_pyproject_range(monkeypatch, installed):
    expected = _pyproject_verl().specifier.contains(installed, prereleases=True)
    assert _doctor_with_verl(monkeypatch, installed).ok is expected


def test_a_dev_release_of_the_excluded_minor_fails():
    # PEP 440's exclusive ordered comparison: <0.10 excludes 0.10's pre-releases, though 0.10.0.dev0 < 0.10.
    assert not doctor.verl_pin().admits("0.10.0.dev0")
    assert doctor.verl_pin().admits("0.9.2")


def test_the_range_doctor_prints_is_pyprojects(monkeypatch):
    pin, expected = doctor.verl_pin(), _pyproject_verl()
    assert pin.specifier == expected.specifier and set(pin.extras) == expected.extras
    assert f'"verl[{",".join(pin.extras)}]{pin.range}"' in PYPROJECT.read_text()  # written as pyproject writes it
    check = _doctor_with_verl(monkeypatch, "0.9.1")
    assert check.ok and check.message == f"verl 0.9.1 (dapo-verl requires verl{pin.range})."


def test_outside_the_range_doctor_fails_naming_the_version_the_range_and_the_fix(monkeypatch):
    pin = doctor.verl_pin()
    check = _doctor_with_verl(monkeypatch, "0.10.0.dev0")
    assert not check.ok and check.tag == "[FAIL]"
    assert check.message.startswith("verl 0.10.0.dev0 is installed, outside the range")
    assert f"verl{pin.range} " in check.message and "\n" not in check.message
    assert check.fix == f'pip install "verl[{",".join(pin.extras)}]{pin.range}"'


def test_a_version_pep_440_cannot_parse_fails_naming_it(monkeypatch):
    check = _doctor_with_verl(monkeypatch, "nightly")
    assert not check.ok and "verl 'nightly' is installed, a version PEP 440 cannot parse" in check.message


def test_without_verl_doctor_stops_at_the_install_fix(monkeypatch):
    def missing(name):
        raise doctor.PackageNotFoundError(name)

    monkeypatch.setattr(doctor, "version", missing)
    (check,) = doctor.run_checks()
    assert (check.name, check.ok) == ("verl installed", False)
    assert check.fix.startswith(doctor.verl_pin().install)


def test_requirements_that_apply_only_with_an_extra_are_not_the_pin(monkeypatch):
    monkeypatch.setattr(
        doctor,
        "requires",
        lambda name: ["torch>=2.6", 'verl[vllm]>=0.9.2,<0.9.5; extra == "vllm"', "verl[math]>=0.9.1,<0.10"],
    )
    assert doctor.verl_pin() == doctor.VerlPin(doctor.SpecifierSet(">=0.9.1,<0.10"), ("math",))


def test_metadata_without_a_verl_requirement_fails_saying_to_reinstall(monkeypatch):
    monkeypatch.setattr(doctor, "requires", lambda name: ["torch>=2.6"])
    check = doctor._verl_version()
    assert not check.ok and "states no requirement on verl" in check.message and "pip install -e ." in check.message
