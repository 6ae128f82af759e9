"""Packaging: one version everywhere, py.typed shipped, the tools' packages optional and
imported where they are used."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pulsar_py
from pulsar_py.io._deps import MissingDependency, require
from pulsar_py.tools.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(pulsar_py.__file__).resolve().parent
OPTIONAL = ("imageio", "matplotlib", "tqdm", "plyfile", "PIL", "viser")


def _installed_distribution():
    """The installed pulsar_py distribution when it is the package imported here (a
    source checkout with a module built in place has none, or another one)."""
    try:
        dist = importlib.metadata.distribution("pulsar_py")
    except importlib.metadata.PackageNotFoundError:
        return None
    init = Path(dist.locate_file("pulsar_py/__init__.py")).resolve()
    return dist if init == PACKAGE / "__init__.py" else None


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_one_version_everywhere():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    project = re.search(r"^project\(pulsar_py\s+VERSION\s+([0-9.]+)", cmake, re.MULTILINE)
    assert project, "CMakeLists.txt: project(pulsar_py VERSION ...) not found"
    assert pulsar_py.__version__ == pulsar_py.build_info()["version"] == project.group(1)
    # The wheel's version: scikit-build-core applies pyproject's regex to CMakeLists.txt.
    config = _pyproject()
    assert "version" not in config["project"] and config["project"]["dynamic"] == ["version"]
    provider = config["tool"]["scikit-build"]["metadata"]["version"]
    assert provider["provider"] == "scikit_build_core.metadata.regex" and provider["input"] == "CMakeLists.txt"
    assert re.search(provider["regex"], cmake).group("value") == pulsar_py.__version__
    dist = _installed_distribution()
    if dist is not None:
        assert dist.version == pulsar_py.__version__


def test_py_typed_is_shipped():
    assert (PACKAGE / "py.typed").is_file()
    assert _pyproject()["tool"]["scikit-build"]["wheel"]["packages"] == ["pulsar_py"]
    dist = _installed_distribution()
    if dist is not None:  # installed from the wheel: its RECORD lists the marker
        assert "pulsar_py/py.typed" in {str(f).replace("\\", "/") for f in dist.files}


def test_tools_extra_holds_the_optional_packages():
    extras = _pyproject()["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[ ]", requirement)[0] for requirement in extras["tools"]}
    assert names == {"imageio", "matplotlib", "tqdm", "plyfile", "pulsar_py"}
    assert "pulsar_py[viewer]" in extras["tools"]  # the browser viewer's viser
    assert {re.split(r"[<>=\[ ]", requirement)[0] for requirement in extras["viewer"]} == {"viser"}
    assert "pulsar_py[tools]" in extras["test"]
    assert not any(name in requirement for requirement in _pyproject()["project"]["dependencies"] for name in names)


def test_importing_the_package_and_the_command_line_loads_no_optional_package():
    # torch may import some of them itself (tqdm, where installed): only what comes after counts.
    code = (
        "import sys, torch; before = set(sys.modules); "
        "import pulsar_py, pulsar_py.tools.cli, pulsar_py.io.images, pulsar_py.io.ply, "
        "pulsar_py.tools.render, pulsar_py.tools.demo, pulsar_py.tools.viewer; "
        f"print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in {OPTIONAL!r}))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_optional_packages_are_imported_only_by_the_file_formats_and_tools():
    pattern = re.compile(r"^\s*(?:import|from)\s+(" + "|".join(OPTIONAL) + r")\b|require\(\"(\w+)", re.MULTILINE)
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        found = {a or b for a, b in pattern.findall(path.read_text())}
        if relative.startswith("io/"):
            continue
        if relative.startswith("tools/"):
            assert not found & {"imageio", "PIL", "plyfile"}, (relative, found)  # images and PLY: io/
        else:
            assert not found, (relative, found)  # the renderer


def test_a_missing_package_says_what_to_install(tmp_path, monkeypatch, capsys):
    with pytest.raises(MissingDependency, match=r"'no_such_pkg_x' to do things: pip install no_such_pkg_x"):
        require("no_such_pkg_x.sub", "to do things")
    with pytest.raises(ImportError):
        require("no_such_pkg_x", "to do things")
    monkeypatch.setitem(sys.modules, "imageio", None)
    monkeypatch.setitem(sys.modules, "imageio.v3", None)
    out = tmp_path / "x.png"
    assert cli_main(["sample", "--out", str(out), "--width", "16", "--height", "12", "--spheres", "50"]) == 1
    err = capsys.readouterr().err
    assert "needs the package 'imageio'" in err and "pulsar_py[tools]" in err
    assert not out.exists()


def test_installed_script_names_itself(tmp_path):
    script = Path(sys.executable).parent / "pulsar-py"
    if _installed_distribution() is None or not script.exists():
        pytest.skip("pulsar_py is not installed with its script in this interpreter's environment")
    done = subprocess.run([str(script), "render", "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: pulsar-py render ")
    done = subprocess.run([str(script), "--version"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == f"pulsar_py {pulsar_py.__version__}"
