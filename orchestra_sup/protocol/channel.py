"""What one receiver serves: the union of the frame bodies its handler takes, and the one answer
to a frame outside it.

Every socket decodes the whole `frames.Body` (`protocol.codec`: an undecodable frame is refused
there, `bad_frame`, with the same message whatever the receiver). A receiver then admits a
request through its `Channel` before its handler sees it: a body of the channel's union reaches
the handler as an `Envelope[U]`, so the handler's `match` covers `U` and ends in
`assert_never` (a case dropped is a type error, and an `AssertionError` answered `internal` at
run time); any other body is answered here, `Error(unexpected)` in the receiver's words, the
same answer each role wrote out for itself before. `NO_SANDBOX` is the one refusal two roles
share for a body they do serve.
"""

from __future__ import annotations

import typing
from typing import Any, Generic, TypeVar

from orchestra_sup.errors import ErrorCode
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Endpoint

U = TypeVar("U", bound=f.Body)


class Channel(Generic[U]):
    """The frames a receiver serves.

    `union` is the union alias of the bodies (or one body type); `refusal` is the message for any
    other body, with `{}` where its type's name goes ("the custodian does not serve {}").
    `members` are the union's types, in its order.
    """

    def __init__(self, union: Any, refusal: str):
        self.members: tuple[type[f.Frame], ...] = typing.get_args(union) or (union,)
        self.refusal = refusal

    def unsupported(self, body: f.Body) -> f.Error:
        """The answer to `body` when this receiver does not serve it: `Error(unexpected)`
        saying `refusal` with the body's type name."""
        return f.Error(code=ErrorCode.UNEXPECTED, message=self.refusal.format(type(body).__name__))

    def admit(
        self, ep: Endpoint, peer: bytes | None, env: f.Envelope[f.Body]
    ) -> f.Envelope[U] | None:
        """`env` as an envelope of this channel when its body is one of `members`; else None,
        once `env` is answered `unsupported` (on `ep`, to `peer`). Never raises."""
        if isinstance(env.body, self.members):
            return typing.cast("f.Envelope[U]", env)
        ep.reply(env, peer, self.unsupported(env.body))
        return None


NO_SANDBOX = f.Error(code=ErrorCode.FORBIDDEN, message="the coordinator never holds a sandbox")
"""The answer to a `SandboxCreate` the coordinator is party to (ARCHITECTURE.md §11 invariant 6):
sent to the coordinator, or sent by it to the custodian."""
