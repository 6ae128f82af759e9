"""Optional dependencies of the file formats and tools, imported when first used.

The renderer needs torch and numpy alone; images (imageio), plots (matplotlib),
progress bars (tqdm) and PLY files (plyfile) come with the ``tools`` extra
(``pip install "pulsar_py[tools]"``). ``require`` imports one of them and, where it is
missing, raises ``MissingDependency`` (an ImportError) that says what to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Optional

#: The extra of pyproject.toml that installs every optional dependency.
EXTRA = "tools"


class MissingDependency(ImportError):
    """An optional package that a file format or tool needs is not installed."""


def require(module: str, purpose: str, package: Optional[str] = None) -> ModuleType:
    """``importlib.import_module(module)``; where it is missing, MissingDependency naming
    the package (``package``, default the module's top-level name) and ``purpose``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        name = package or module.split(".")[0]
        if exc.name is None or exc.name.split(".")[0] != module.split(".")[0]:
            raise  # something the package itself imports is missing: its own error says more
        raise MissingDependency(
            f"pulsar_py needs the package {name!r} {purpose}: pip install {name} "
            f'(or pip install "pulsar_py[{EXTRA}]" for every tool\'s packages)',
            name=name,
        ) from None
