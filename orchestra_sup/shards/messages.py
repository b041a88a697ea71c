"""What reaches a live lane from outside it: an operator's or a plan's text (`message_lane`,
`deliver_message`) and a human's answer to the lane's question (`deliver_answer`).

A shell lane reads its messages from its inbox file (`$ORCHESTRA_INBOX`, one line each); a lane
program from its mailbox (`LaneContext.recv`). Either way each message is an event row in the
lane's transcript, and its idempotency key (`LaneMessage.key`) is remembered with the lane, so a
re-sent message is acknowledged again and never delivered twice. An ended lane's inbox file is
removed (`remove_inbox`, issue 22): one per lane that ever ran would pile up in `inboxes/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from orchestra_sup.errors import ErrorCode
from orchestra_sup.protocol import frames as f
from orchestra_sup.protocol.endpoint import Endpoint
from orchestra_sup.runtime.node import Node
from orchestra_sup.shards.host import inbox_path
from orchestra_sup.shards.lane import Lane
from orchestra_sup.shards.program import MAILBOX_SIZE
from orchestra_sup.shards.transcript import Transcript
from orchestra_sup.state.permissions import PRIVATE_DIR, PRIVATE_FILE

MESSAGE_MAX_BYTES = 64 * 1024
"""The largest `message_lane` text (UTF-8 bytes): a lane's mailbox then holds at most 64 MiB."""
MESSAGE_KEYS = 4096
"""Idempotency keys remembered per lane: a re-send of any of its last 4,096 messages is caught."""


def deliver_message(
    node: Node,
    transcript: Transcript | None,
    lane: Lane,
    ep: Endpoint,
    peer: bytes | None,
    env: f.Envelope,
    msg: f.LaneMessage,
) -> None:
    """Deliver `msg` to live `lane` and answer `env` on `ep`: `MessageAck` (`duplicate` for a
    key already seen), `bad_request` for a text over `MESSAGE_MAX_BYTES`, `busy` when a
    program's mailbox is full (`MAILBOX_SIZE` unread). A program's message goes into its
    mailbox; a shell lane's is one line appended to its inbox file, and an event row in its
    transcript either way. The idempotency key is claimed here, on the loop, before anything is
    awaited, so a re-sent message can never be delivered twice; messages to one lane are written
    in order, off the loop (`node.answer` replies once the line is written)."""
    if len(msg.text.encode()) > MESSAGE_MAX_BYTES:
        ep.reply(
            env,
            peer,
            f.Error(
                code=ErrorCode.BAD_REQUEST,
                message=f"a message is at most {MESSAGE_MAX_BYTES} bytes",
            ),
        )
        return
    if lane.message_keys is not None and msg.key in lane.message_keys:
        ep.reply(env, peer, f.MessageAck(lane=lane.id, key=msg.key, duplicate=True))
        return
    if lane.mailbox is not None and lane.mailbox.full():
        ep.reply(
            env,
            peer,
            f.Error(
                code=ErrorCode.BUSY,
                message=f"lane {lane.id}'s mailbox is full ({MAILBOX_SIZE} unread messages)",
            ),
        )
        return
    if lane.message_keys is None:
        lane.message_keys = {}
    lane.message_keys[msg.key] = None
    if len(lane.message_keys) > MESSAGE_KEYS:  # a re-send comes soon after its timeout
        del lane.message_keys[next(iter(lane.message_keys))]
    if transcript is not None:
        transcript.event(lane.id, f"message ({msg.key}): {msg.text}")
    if lane.mailbox is not None:
        lane.mailbox.put_nowait(msg.text)
        ep.reply(env, peer, f.MessageAck(lane=lane.id, key=msg.key, duplicate=False))
        return
    inbox = inbox_path(node.paths.state_dir, lane.id)

    async def deliver() -> f.Body:
        if lane.inbox_lock is None:
            lane.inbox_lock = asyncio.Lock()
        async with lane.inbox_lock:
            await asyncio.to_thread(_append_line, inbox, msg.text)
        return f.MessageAck(lane=lane.id, key=msg.key, duplicate=False)

    node.answer(ep, peer, env, deliver())


def deliver_answer(transcript: Transcript | None, lane: Lane, answer: f.HitlAnswer) -> None:
    """Keep a human's answer (`HitlAnswer`, recorded by the coordinator before it was sent)
    with the lane and resume its program if it waits on that key. A second answer to a key,
    or one to a shell lane (which never asks), changes nothing."""
    if lane.questions is None or not lane.questions.answer(answer.key, answer.answer):
        return
    if transcript is not None:
        who = answer.answer.responder or f"uid {answer.answer.uid}"
        transcript.event(lane.id, f"answered ({answer.key}): {answer.answer.verdict} by {who}")


def _append_line(path: Path, text: str) -> None:
    """Append to inbox `path`, made 0600 in a 0700 directory when missing (`Host._inbox`)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    with open(os.open(path, flags, PRIVATE_FILE), "a", encoding="utf-8") as fh:
        fh.write(text.replace("\n", " ") + "\n")


async def remove_inbox(state_dir: Path, lane: Lane) -> None:
    """Remove ended `lane`'s inbox file (`host.inbox_path`; none is fine), after the line being
    appended to it, if one is: nothing reads it again. Not covered: a message accepted just as
    the lane ended, whose append starts after this, makes the file again (unread, as it was)."""
    if lane.inbox_lock is None:
        lane.inbox_lock = asyncio.Lock()
    async with lane.inbox_lock:
        await asyncio.to_thread(_unlink, inbox_path(state_dir, lane.id))


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
