"""orchestra-sup: a supervisor that gives each role of an agent platform its own OS process.

The package's public face: `orchestra_sup.Client` and `orchestra_sup.AsyncClient` (the Python
SDK, `client.sdk` and `client.aio`) and `__version__` (`release.INSTALLED_VERSION`). Each is
imported on first use (PEP 562 `__getattr__`), so `import orchestra_sup.errors`, as every
process of a tree does, imports none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestra_sup.client.aio import AsyncClient
    from orchestra_sup.client.sdk import Client

__all__ = ["AsyncClient", "Client", "__version__"]


def __getattr__(name: str) -> Any:
    """`Client`, `AsyncClient` and `__version__`, imported when first asked for."""
    if name == "Client":
        from orchestra_sup.client.sdk import Client

        return Client
    if name == "AsyncClient":
        from orchestra_sup.client.aio import AsyncClient

        return AsyncClient
    if name == "__version__":
        from orchestra_sup.release import INSTALLED_VERSION

        return INSTALLED_VERSION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
