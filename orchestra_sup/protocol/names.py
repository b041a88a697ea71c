"""How a file name travels on the wire: as text when its bytes are UTF-8, else with its exact
bytes beside it.

A file name on Linux, and in git, is any bytes but `/` and NUL. In this process a name is the
`str` `os.fsdecode` makes of it, where each byte that is not part of valid UTF-8 becomes a lone
surrogate (U+DC80..U+DCFF), which neither msgpack nor JSON can carry. So a name field `K`
(`name`, `path`) in a read tool's answer holds

* the name itself when its bytes are valid UTF-8 (the usual case: the text is the name), and
  then no other field;
* otherwise a display form, each byte that is not UTF-8 shown as U+FFFD, and beside it `K_b64`:
  the name's exact bytes in standard base64 (RFC 4648, with padding).

Wherever `K_b64` is, it is the name and `K` only shows it. Why a second field and not an escape
inside `K`: every escape sequence is also a valid file name,
so an escaped `K` would have to escape every name to stay unambiguous, and the usual name would
no longer read as itself. A field present only for the odd name keeps every UTF-8 name exact and
makes the odd one explicit and lossless.

A request names a path the same way: `path=` (text) or `path_b64=` (exact bytes, which wins when
both are given, so the fields of an answer can be sent back as they are).
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping

from orchestra_sup.errors import ErrorCode, RemoteError

BYTES_SUFFIX = "_b64"
"""What a field holding a name's exact bytes adds to the name field's key."""


def is_text(name: str) -> bool:
    """True when `name` (as `os.fsdecode` makes it) is valid UTF-8 text: no lone surrogate."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def wire(key: str, name: str) -> dict[str, str]:
    """The fields that carry `name` (a str from `os.fsdecode`) under `key`: `{key: name}` when it
    is text, else `{key: display form, key + "_b64": base64 of its bytes}` (module docstring)."""
    if is_text(name):
        return {key: name}
    raw = os.fsencode(name)
    return {
        key: raw.decode("utf-8", errors="replace"),
        key + BYTES_SUFFIX: base64.b64encode(raw).decode("ascii"),
    }


def from_wire(fields: Mapping[str, str], key: str) -> str | None:
    """The name `fields` carry under `key` (the inverse of `wire`, and how a request's `path=`
    or `path_b64=` is read), in this process's form (`os.fsdecode`): `key_b64` decoded when it
    is there, else `key`; None when neither is.

    Raises `RemoteError(BAD_REQUEST)` when `key_b64` is not base64."""
    raw = fields.get(key + BYTES_SUFFIX)
    if raw is None:
        return fields.get(key)
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise RemoteError(
            ErrorCode.BAD_REQUEST,
            f"{key}{BYTES_SUFFIX} {raw[:80]!r} is not base64 (RFC 4648, padded)",
        ) from None
    return os.fsdecode(data)


def request_param(key: str, value: str) -> tuple[str, str]:
    """The request parameter to send for `value` given as `key` (a str from argv, so possibly
    holding surrogates): `(key, value)` when it is text, else `(key + "_b64", its bytes in
    base64)`."""
    if is_text(value):
        return key, value
    return key + BYTES_SUFFIX, base64.b64encode(os.fsencode(value)).decode("ascii")
