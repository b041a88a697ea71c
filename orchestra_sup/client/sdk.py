"""The public Python SDK's blocking client (`orchestra_sup.Client`)."""

from __future__ import annotations

from orchestra_sup.protocol import frames as f


def message_request(plan_id: str, text: str) -> f.CtlMessage:
    """The `CtlMessage` that sends `text` to plan `plan_id`'s session. Raises `ValueError` when
    `text` is over `frames.MESSAGE_MAX_BYTES` bytes of UTF-8 (nothing is sent)."""
    size = len(text.encode("utf-8", "surrogateescape"))
    if size > f.MESSAGE_MAX_BYTES:
        raise ValueError(
            f"the message is {size} bytes of UTF-8, over the {f.MESSAGE_MAX_BYTES} a plan takes"
        )
    return f.CtlMessage(plan=plan_id, text=text)
