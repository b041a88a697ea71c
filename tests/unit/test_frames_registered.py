"""Every frame defined under `protocol/frames/` is on the wire: a member of `Body` (the union
the codec decodes, made of each channel's union) and re-exported by the package.

A frame left out of its channel's union encodes but is refused `bad_frame` by every peer, and
one left out of the re-exports is missing from `frames.X`; both are easy to forget when adding
a frame (docs/architecture.md, "Where a change goes"), so this names the one that was.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

from orchestra_sup.protocol import frames
from orchestra_sup.protocol.frames.frame import Frame


def _defined_frames() -> dict[str, type[Frame]]:
    found: dict[str, type[Frame]] = {}
    for info in pkgutil.iter_modules(frames.__path__, f"{frames.__name__}."):
        module = importlib.import_module(info.name)
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, Frame) and cls is not Frame:
                found[f"{info.name.rsplit('.', 1)[1]}.{name}"] = cls
    return found


def test_every_frame_is_a_member_of_body() -> None:
    members = set(typing.get_args(frames.Body))
    missing = sorted(where for where, cls in _defined_frames().items() if cls not in members)
    assert missing == [], f"add these to their channel's union: {missing}"


def test_every_frame_is_re_exported() -> None:
    missing = sorted(
        where
        for where, cls in _defined_frames().items()
        if getattr(frames, cls.__name__, None) is not cls or cls.__name__ not in frames.__all__
    )
    assert missing == [], (
        f"import these in protocol/frames/__init__.py and list them in __all__: {missing}"
    )


def test_the_walk_reaches_every_channel() -> None:
    """Not an empty walk: frames of each channel module are found."""
    modules = {where.split(".")[0] for where in _defined_frames()}
    assert {"control", "ctl", "lanes", "rollover", "sandbox", "relay", "inbox", "frame"} <= modules
