"""The base of every frame body, and the two answers every channel shares.

`Frame` is a tagged msgspec Struct (tag field "t"): each subclass names its wire tag, which is
stable (renaming a class must not change it). `Ack` and `Error` answer requests on every channel.
"""

from __future__ import annotations

import msgspec

from orchestra_sup.errors import ErrorCode


class Frame(msgspec.Struct, frozen=True, kw_only=True, tag_field="t"):
    """Base of every frame body."""


class Ack(Frame, tag="ack"):
    """A request was carried out and has nothing more to say."""


class Error(Frame, tag="error"):
    """A request failed; `code` says which kind (see `errors.ErrorCode`)."""

    code: ErrorCode
    message: str
