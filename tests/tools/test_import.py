"""What ``import pulsar_py`` does: it costs little beyond ``import torch``, leaves torch.compile's
machinery (torch._dynamo) unloaded, offers its documented subpackages as attributes, and in a
source tree without the compiled module says what to do in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy
import torch

import pulsar_py

PACKAGE = Path(pulsar_py.__file__).resolve().parent
#: What ``import pulsar_py`` and ``pulsar-py --version`` may add to ``import torch`` (seconds).
IMPORT_BUDGET_S = 0.5

# One fresh interpreter: import torch, then pulsar_py, then run ``pulsar-py --version`` (the
# command line imports the package at that point); the seconds each step takes, and which
# modules the import loaded.
_MEASURE = """
import json, sys, time, contextlib, io
t0 = time.perf_counter(); import torch; t1 = time.perf_counter()
import pulsar_py; t2 = time.perf_counter()
loaded = sorted(m for m in ("torch._dynamo", "pulsar_py.gradcheck", "pulsar_py.tools", "pulsar_py.io")
                if m in sys.modules)
from pulsar_py.tools.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    status = main(["--version"])
t3 = time.perf_counter()
attributes = [pulsar_py.gradcheck.gradcheck.__module__, pulsar_py.distributed.ShardedRenderer.__name__,
              pulsar_py.io.__name__, pulsar_py.tools.__name__]
print(json.dumps(dict(torch=t1 - t0, package=t2 - t1, version=t3 - t1, loaded=loaded, status=status,
                      printed=out.getvalue().strip(), attributes=attributes)))
"""


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(PACKAGE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _measure(tmp_path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE], cwd=tmp_path, env=_child_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_costs_little_beyond_torch_and_subpackages_load_at_first_use(tmp_path):
    runs = [_measure(tmp_path)]
    first = runs[0]
    assert first["loaded"] == [], f"import pulsar_py loaded {first['loaded']}"
    assert first["attributes"] == ["pulsar_py.gradcheck", "ShardedRenderer", "pulsar_py.io", "pulsar_py.tools"]
    assert not hasattr(pulsar_py, "no_such_name")
    assert first["status"] == 0 and first["printed"] == f"pulsar_py {pulsar_py.__version__}"
    # The best of up to three runs: a shared machine only ever makes a run slower.
    while len(runs) < 3 and max(runs[-1]["package"], runs[-1]["version"]) > IMPORT_BUDGET_S:
        runs.append(_measure(tmp_path))
    package = min(run["package"] for run in runs)
    version = min(run["version"] for run in runs)
    torch_s = min(run["torch"] for run in runs)
    assert package <= IMPORT_BUDGET_S, f"import pulsar_py took {package:.2f} s after import torch ({torch_s:.2f} s)"
    assert version <= IMPORT_BUDGET_S, f"pulsar-py --version took {version:.2f} s after import torch ({torch_s:.2f} s)"


def test_a_source_tree_without_the_compiled_module_says_what_to_do(tmp_path):
    # The repository root as a new user meets it: the source folder pulsar_py/ (never built
    # there) comes first on the path and shadows the installed package.
    shutil.copytree(
        PACKAGE,
        tmp_path / "pulsar_py",
        ignore=lambda folder, names: [
            n for n in names if n.startswith("_native.") and not n.endswith(".pyi") or n == "__pycache__"
        ],
    )
    assert not list((tmp_path / "pulsar_py").glob("_native.*[!i]"))
    # -S: no site-packages hooks (an editable install's finder would supply the module);
    # torch and numpy come from their folders on PYTHONPATH.
    folders = {str(Path(module.__file__).resolve().parents[1]) for module in (torch, numpy)}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sorted(folders)))
    done = subprocess.run(
        [sys.executable, "-S", "-c", "import pulsar_py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"ImportError: pulsar_py: the compiled module pulsar_py._native is missing from {tmp_path / 'pulsar_py'}"
    ), done.stderr
    assert "pip install ." in last and "build it in place (pip install -e .)" in last, last
    assert "circular import" not in done.stderr
