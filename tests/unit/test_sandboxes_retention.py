"""Finished lanes' sandboxes (`custodian.sandboxes`): only a sandbox marked ended longer ago
than the retention goes, with its mark; an unmarked one stays; one whose lane locked a
directory goes anyway; a mark with no sandbox goes."""

from __future__ import annotations

import os
from pathlib import Path

from orchestra_sup.custodian.sandboxes import ENDED, mark_ended, prune
from orchestra_sup.custodian.workspace import base_record


def sandbox(root: Path, lane: str) -> Path:
    path = root / lane
    (path / "src").mkdir(parents=True)
    (path / "src" / "f.txt").write_text("x")
    return path


def test_only_what_ended_long_enough_ago_goes(tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    old, recent, live = (sandbox(root, lane) for lane in ("p-a-1", "p-b-1", "p-c-1"))
    for lane in ("p-a-1", "p-b-1", "p-gone-1"):
        mark_ended(root, lane)
    marks = root / ENDED
    os.utime(marks / "p-a-1", (1000.0, 1000.0))
    os.utime(marks / "p-gone-1", (1000.0, 1000.0))
    locked = old / "src"
    locked.chmod(0o500)  # the lane took its own write permission away
    gone = prune(root, keep_s=3600.0, now=10_000.0)
    assert gone == ["p-a-1"]
    assert not old.exists() and recent.is_dir() and live.is_dir()
    assert sorted(p.name for p in marks.iterdir()) == ["p-b-1"]  # p-gone-1's mark went too
    mark_ended(root, "p-b-1")  # a second mark keeps the first's time
    assert prune(root, keep_s=0.0) == ["p-b-1"] and live.is_dir()


def test_no_marks_no_removal(tmp_path: Path) -> None:
    root = tmp_path / "sandboxes"
    live = sandbox(root, "p-a-1")
    assert prune(root, keep_s=0.0) == [] and live.is_dir()


def test_a_removed_sandboxs_base_record_goes_with_it(tmp_path: Path) -> None:
    """The record of a sandbox's base commit beside it (`workspace.base_record`) goes with the
    sandbox, and with a mark whose sandbox is gone; a live sandbox's stays (issue 22: one a
    lane, they piled up)."""
    root = tmp_path / "sandboxes"
    ended, live = sandbox(root, "p-a-1"), sandbox(root, "p-c-1")
    for path in (ended, live, root / "p-gone-1"):
        base_record(path).write_text("0" * 40 + "\n")
    mark_ended(root, "p-a-1")
    mark_ended(root, "p-gone-1")
    assert prune(root, keep_s=0.0) == ["p-a-1"]
    assert sorted(p.name for p in root.iterdir()) == [".ended", ".p-c-1.base", "p-c-1"]
    assert list((root / ENDED).iterdir()) == []
