"""Check and parsing of the build folders an A/B compares (ab_kernels.py, ab_bench.py):
each must hold pulsar_py with one built _native module, and no two the same module.

Why: a build whose link never ran (for example `ninja ... | head`, which ends ninja when
head closes the pipe) leaves the previous module in place, and an A/B of two copies of
one module reports "no change" (docs/benchmarks.md, tenth session).
"""
import hashlib
from pathlib import Path
from typing import List, Tuple


def module_digest(package_dir: str) -> str:
    """SHA-256 of the _native module under package_dir/pulsar_py (exactly one expected)."""
    modules = sorted(Path(package_dir, "pulsar_py").glob("_native*.so"))
    if len(modules) != 1:
        found = ", ".join(m.name for m in modules) or "none"
        raise SystemExit(f"{package_dir}: expected one pulsar_py/_native*.so, found {found}")
    return hashlib.sha256(modules[0].read_bytes()).hexdigest()


def require_distinct_builds(package_dirs: List[str]) -> None:
    """Exits with a message naming the folders when two of them carry the same module."""
    seen = {}
    for folder in package_dirs:
        digest = module_digest(folder)
        if digest in seen:
            raise SystemExit(f"{seen[digest]} and {folder} carry the same _native module "
                             f"(sha256 {digest[:12]}): rebuild, and check that the link ran")
        seen[digest] = folder


def require_one_module(package_dirs: List[str]) -> None:
    """Exits unless every folder carries the same _native module (an A/B of Python only)."""
    digests = {module_digest(folder) for folder in package_dirs}
    if len(digests) != 1:
        raise SystemExit(f"--python-only: expected one _native module in {', '.join(package_dirs)}, "
                         f"found {len(digests)} different ones")


def builds_and_rest(args: List[str]) -> Tuple[List[str], List[str], List[str]]:
    """Splits `[--python-only] A_DIR B_DIR ... -- REST` into the build folders, their
    labels A, B, ... and the rest. The folders must carry distinct _native modules
    (require_distinct_builds), or with --python-only one and the same (the A/B of a change
    to the Python package alone)."""
    split = args.index("--") if "--" in args else len(args)
    packages, rest = args[:split], args[split + 1:]
    if "--python-only" in packages:
        packages = [p for p in packages if p != "--python-only"]
        require_one_module(packages)
    else:
        require_distinct_builds(packages)
    return packages, [chr(ord("A") + i) for i in range(len(packages))], rest
