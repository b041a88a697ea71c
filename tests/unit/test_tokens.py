"""The HTTP API's bearer tokens (`protocol.tokens`, `keys init --http-token`): printed once,
kept hashed, checked in constant time, each with its role."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol.tokens import (
    READ,
    RECORD_MAX,
    TOKENS_DIR,
    Token,
    TokenTable,
    issue_token,
)


def test_a_token_is_checked_by_its_hash_and_says_whose_it_is(tmp_path: Path) -> None:
    ops = issue_token(tmp_path, "ops")
    ci = issue_token(tmp_path, "ci.bot_1", READ)
    table, _ = TokenTable.load(tmp_path)
    assert len(table) == 2
    assert table.check(ops) == Token(name="ops", role="operate")
    assert table.check(ci) == Token(name="ci.bot_1", role="read")
    assert not table.check(ci).operates  # type: ignore[union-attr]
    record = (tmp_path / TOKENS_DIR / "ops.toml").read_text()
    assert ops not in record and ops.split("_")[-1] not in record  # only the hash is kept
    assert stat.S_IMODE((tmp_path / TOKENS_DIR / "ops.toml").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    "forged",
    [
        "",
        "Bearer x",
        "osup_ops_" + "A" * 43,  # a real name, a wrong secret
        "osup_nobody_" + "A" * 43,  # no such name
        "osup_ops_" + "A" * 42,  # too short
    ],
)
def test_anything_else_is_no_token(tmp_path: Path, forged: str) -> None:
    issue_token(tmp_path, "ops")
    assert TokenTable.load(tmp_path)[0].check(forged) is None


def test_a_token_is_never_replaced_and_bad_names_and_roles_are_refused(tmp_path: Path) -> None:
    issue_token(tmp_path, "ops")
    with pytest.raises(ConfigError, match="exists"):
        issue_token(tmp_path, "ops")
    with pytest.raises(ConfigError, match="key name"):
        issue_token(tmp_path, "a/b")
    with pytest.raises(ConfigError, match="role 'admin'"):
        issue_token(tmp_path, "x", "admin")


def test_a_damaged_token_file_refuses_its_own_token_only(tmp_path: Path) -> None:
    """A token file that says nonsense is named in one line and refuses its token; the
    others are admitted (one bad file must not keep the API, or a re-exec, from starting)."""
    ops, ci = issue_token(tmp_path, "ops"), issue_token(tmp_path, "ci")
    (tmp_path / TOKENS_DIR / "ops.toml").write_text('role = "root"\n')
    table, damaged = TokenTable.load(tmp_path)
    assert len(damaged) == 1 and "ops.toml: needs role" in damaged[0]
    assert table.check(ops) is None and table.check(ci) == Token(name="ci", role="operate")


def test_only_a_small_regular_file_is_read(tmp_path: Path) -> None:
    """A token file is read on the supervisor's loop: a FIFO (which would block it), a
    device, or a file over RECORD_MAX bytes refuses its token, at once."""
    ops = issue_token(tmp_path, "ops")
    record = tmp_path / TOKENS_DIR / "ops.toml"
    text = record.read_text()
    table, _ = TokenTable.load(tmp_path)
    record.write_text(text + "#" * RECORD_MAX)
    assert table.check(ops) is None
    record.unlink()
    os.mkfifo(record)
    assert table.check(ops) is None  # returns: nothing opened it for writing
    record.unlink()
    record.symlink_to("/dev/zero")
    assert table.check(ops) is None
    record.unlink()
    record.write_text(text)
    assert table.check(ops) == Token(name="ops", role="operate")


def test_keys_init_prints_the_token_once(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "orchestra_sup", "keys", "init", "--dir", str(tmp_path)]
    made = subprocess.run(
        [*argv, "--http-token", "dash", "--role", "read", "--json"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    assert TokenTable.load(tmp_path)[0].check(token) == Token(name="dash", role="read")
    again = subprocess.run([*argv, "--http-token", "dash"], capture_output=True, text=True)
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1
    stray = subprocess.run([*argv, "--role", "read"], capture_output=True, text=True)
    assert stray.returncode == 2 and "--role is for --http-token" in stray.stderr


def test_a_token_made_or_revoked_later_counts_at_its_next_request(tmp_path: Path) -> None:
    """The table reads a token's file when it is presented: no restart admits a new token or
    refuses a revoked one, and a role changed on disk is the role of the next request."""
    table, _ = TokenTable.load(tmp_path)
    assert len(table) == 0
    late = issue_token(tmp_path, "late")
    assert table.check(late) == Token(name="late", role="operate")
    record = tmp_path / TOKENS_DIR / "late.toml"
    record.write_text(record.read_text().replace("operate", "read") + "\n")
    assert table.check(late) == Token(name="late", role="read")
    record.unlink()
    assert table.check(late) is None
    assert len(table) == 0
