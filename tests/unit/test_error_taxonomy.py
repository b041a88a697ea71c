"""Every exception class orchestra-sup defines is an `OrchestraError` (issue 18): `except
OrchestraError` and `endpoint.unexpected` then tell an error raised on purpose from a bug
by its class alone, wherever the class lives."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import orchestra_sup
from orchestra_sup.errors import OrchestraError


def _defined_exceptions() -> list[type[BaseException]]:
    found = []
    for module_info in pkgutil.walk_packages(orchestra_sup.__path__, "orchestra_sup."):
        if module_info.name.rsplit(".", 1)[-1] == "__main__":  # importing it runs it
            continue
        module = importlib.import_module(module_info.name)
        for _name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, BaseException):
                found.append(cls)
    return found


def test_every_exception_is_an_orchestra_error() -> None:
    found = _defined_exceptions()
    assert len(found) > 20  # the walk reached the package, not an empty path
    outside = [c for c in found if not issubclass(c, OrchestraError)]
    assert [f"{c.__module__}.{c.__qualname__}" for c in outside] == []
