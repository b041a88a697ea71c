"""An ended lane's inbox file goes (`shards.messages.remove_inbox`, issue 22): after the line
being appended to it, never under it; one already gone is no error."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestra_sup.protocol import frames as f
from orchestra_sup.shards.host import inbox_path
from orchestra_sup.shards.lane import Lane
from orchestra_sup.shards.messages import remove_inbox


def test_an_ended_lanes_inbox_goes_once_the_append_in_progress_is_done(tmp_path: Path) -> None:
    async def main() -> None:
        lane = Lane(f.LaneStart(lane="L", plan="p", task=f.TaskSpec(id="t", run="true")))
        inbox = inbox_path(tmp_path, "L")
        inbox.parent.mkdir()
        inbox.write_text("hello\n")
        lane.inbox_lock = asyncio.Lock()
        await lane.inbox_lock.acquire()  # a message's line is being appended
        removal = asyncio.create_task(remove_inbox(tmp_path, lane))
        await asyncio.sleep(0)  # one step: the removal now waits on the lock
        assert not removal.done() and inbox.exists()
        lane.inbox_lock.release()
        await removal
        assert not inbox.exists()
        await remove_inbox(tmp_path, lane)  # gone already: nothing to do

    asyncio.run(main())
