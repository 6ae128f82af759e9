"""benchmarks/ab_builds.py: the A/B scripts refuse build folders that carry the same module."""
import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "ab_builds.py"
_spec = importlib.util.spec_from_file_location("ab_builds", _PATH)
ab_builds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab_builds)


def _build(root: Path, name: str, content: bytes) -> str:
    package = root / name / "pulsar_py"
    package.mkdir(parents=True)
    (package / "_native.cpython-312-x86_64-linux-gnu.so").write_bytes(content)
    return str(root / name)


def test_distinct_modules_pass(tmp_path):
    ab_builds.require_distinct_builds([_build(tmp_path, "a", b"one"), _build(tmp_path, "b", b"two")])


def test_same_module_twice_is_refused(tmp_path):
    a, b = _build(tmp_path, "a", b"same"), _build(tmp_path, "b", b"same")
    with pytest.raises(SystemExit, match="carry the same _native module"):
        ab_builds.require_distinct_builds([a, b])


def test_folder_without_module_is_refused(tmp_path):
    (tmp_path / "empty" / "pulsar_py").mkdir(parents=True)
    with pytest.raises(SystemExit, match="expected one pulsar_py/_native"):
        ab_builds.module_digest(str(tmp_path / "empty"))
