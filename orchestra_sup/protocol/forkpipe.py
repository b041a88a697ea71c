"""The fork template's pipe: the supervisor's requests and the template's replies.

The supervisor (`supervisor.template.ForkTemplate`) writes one JSON line per `Request` on the
template's command pipe and reads one JSON line per `Reply` from its reply pipe, in order
(`node.template`: what each request does). Each is a msgspec Struct tagged in its `type` field;
the tags are the pipe's names and stay as they are.
"""

from __future__ import annotations

import msgspec

from orchestra_sup.protocol.childargs import ChildArgs


class Fork(msgspec.Struct, frozen=True, kw_only=True, tag="fork"):
    """Fork a child that will run `args`."""

    args: ChildArgs


class _Pid(msgspec.Struct, frozen=True, kw_only=True):
    """A request or a reply about one process: `pid`."""

    pid: int


class Release(_Pid, tag="release"):
    """Let the forked child `pid` become the supervisor's child and start."""


class Ready(_Pid, tag="ready"):
    """The template has imported everything and is clean; `pid` is its own."""


class Forked(_Pid, tag="forked"):
    """A child was forked and is held until `Release`; `pid` is the child's."""


class Released(_Pid, tag="released"):
    """The child `pid` is now the supervisor's child and has been told to start."""


class Refused(msgspec.Struct, frozen=True, kw_only=True, tag="refused"):
    """The request was not carried out; `reason` says why (for a `Fork`: what is unclean)."""

    reason: str


Request = Fork | Release
Reply = Ready | Forked | Released | Refused
