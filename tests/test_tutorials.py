"""The test command runs the tutorials we ship, and only those: notebooks/ is also JupyterLab's root,
where a user's own notebooks (an Untitled.ipynb) are not tests."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tracked_tutorials() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked tutorials to compare with")
    listed = subprocess.run(["git", "ls-files", "notebooks/*.ipynb"], cwd=ROOT, capture_output=True, text=True,
                            timeout=30, check=True)
    return sorted(listed.stdout.split())


def test_the_test_command_collects_exactly_the_tracked_tutorials(pytestconfig):
    testpaths = pytestconfig.getini("testpaths")
    notebooks = sorted(p for p in testpaths if p.startswith("notebooks"))
    assert "notebooks" not in testpaths and "notebooks/" not in testpaths  # the folder would take every notebook
    assert all(p.endswith(".ipynb") and "*" not in p for p in notebooks), notebooks  # named one by one
    assert notebooks == _tracked_tutorials()
    assert all((ROOT / p).is_file() for p in notebooks)  # pytest drops a testpaths entry that matches nothing
