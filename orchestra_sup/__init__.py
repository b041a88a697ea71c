"""orchestra-sup: a supervisor that gives each role of an agent platform its own OS process.

The package's public face: `__version__` (`release.INSTALLED_VERSION`), imported on first use
(PEP 562 `__getattr__`), so that `import orchestra_sup.errors`, as every process of a tree
does, imports nothing more, and no part of the package needs to import `orchestra_sup` itself.
"""

from __future__ import annotations

from typing import Any

__all__ = ["__version__"]


def __getattr__(name: str) -> Any:
    """`__version__`, imported when first asked for."""
    if name == "__version__":
        from orchestra_sup.release import INSTALLED_VERSION

        return INSTALLED_VERSION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
