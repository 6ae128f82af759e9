"""The repository's style, checked as CI checks it: ruff's lint and format over the Python
files and clang-format over the C++ and CUDA sources, with the versions the test extra
pins (pyproject.toml) and the settings of pyproject.toml's [tool.ruff] and .clang-format.
A finding fails the test with the tool's report; the fix is the command it names."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]
NATIVE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")

pytestmark = pytest.mark.skipif(
    not (ROOT / ".git").exists(), reason="the style checks read a source checkout (git ls-files)"
)


def _tool(name: str) -> str:
    """The tool beside this interpreter (the venv the test extra installed it into), else on PATH."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install '.[test]' installs the pinned version")
    return found


def _run(args: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def _native_sources() -> List[str]:
    listed = _run(["git", "ls-files", *(f"*{s}" for s in NATIVE_SUFFIXES)])
    assert listed.returncode == 0, listed.stderr
    return listed.stdout.split()


def test_python_passes_ruff_check():
    done = _run([_tool("ruff"), "check", "--no-cache", "."])
    assert done.returncode == 0, f"ruff check found (fix: ruff check --fix .):\n{done.stdout}{done.stderr}"


def test_python_is_ruff_formatted():
    done = _run([_tool("ruff"), "format", "--no-cache", "--check", "."])
    assert done.returncode == 0, f"ruff format would change (fix: ruff format .):\n{done.stdout}{done.stderr}"


def test_native_sources_are_clang_formatted():
    sources = _native_sources()
    assert len(sources) > 20, sources  # the listing found the native tree
    done = _run([_tool("clang-format"), "--dry-run", "-Werror", *sources])
    assert done.returncode == 0, (
        "clang-format would change (fix: git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format -i):\n"
        + done.stderr[-4000:]
    )
