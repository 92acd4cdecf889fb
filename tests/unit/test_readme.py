"""README.md stays true: its examples run, and CI runs its set-up and test commands."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CI = (ROOT / ".ci" / "run").read_text()

INSTALL = 'pip install torch==2.13.0 -e ".[test]"'
TEST = 'python -m pytest -m "slow or not slow"'


def test_readme_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    test = doctest.DocTestParser().get_doctest("\n".join(blocks), {}, "README.md", str(ROOT / "README.md"), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0
    assert result.failed == 0


def test_ci_runs_the_readme_commands():
    commands = re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)
    setup_and_test = [c for c in commands if TEST in c]
    assert setup_and_test, "README must give the set-up-and-test command"
    assert INSTALL in setup_and_test[0]
    assert 'install --quiet torch==2.13.0 -e ".[test]"' in CI
    assert '"$VENV/bin/python" -m pytest -m "slow or not slow"' in CI
