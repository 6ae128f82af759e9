"""The suite's size knob: PULSAR_PY_SWEEP sizes the randomised sweeps (small by default,
full on request), and README.md says how to run the full size and how long the test
command takes."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest
import sweep

ROOT = Path(__file__).resolve().parents[2]


def _load(relative: str):
    """A fresh copy of a test module (its sizes are read at import)."""
    spec = importlib.util.spec_from_file_location(f"sized_{Path(relative).stem}", ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweeps_are_small_by_default_and_full_on_request(monkeypatch):
    sizes = {}
    try:
        for value in ("", "small", "full", "FULL"):
            with monkeypatch.context() as env:
                env.delenv("PULSAR_PY_DIFFERENTIAL_SCENES", raising=False)
                env.setenv("PULSAR_PY_SWEEP", value)
                importlib.reload(sweep)
                differential = _load("tests/native/test_differential.py")
                reliability = _load("tests/api/test_reliability.py")
                sizes[value] = (sweep.MODE, differential.SCENES, len(reliability.PRECISION_SCENES))
        with monkeypatch.context() as env:
            env.setenv("PULSAR_PY_SWEEP", "huge")
            with pytest.raises(ValueError, match="PULSAR_PY_SWEEP: expected one of small, full, got 'huge'"):
                importlib.reload(sweep)
    finally:
        importlib.reload(sweep)  # back to this run's setting
    assert sizes[""] == sizes["small"] == ("small", 80, 8)
    assert sizes["full"] == sizes["FULL"] == ("full", 800, 24)


def test_readme_says_how_to_run_the_full_sweeps_and_how_long_the_tests_take():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "PULSAR_PY_SWEEP=full .venv/bin/pytest" in readme
    assert re.search(r"\.venv/bin/pytest` takes about \d+ minutes on 2 CPU cores", readme), (
        "README.md: the time of the test command"
    )
