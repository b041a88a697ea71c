"""The HTTP API's bearer tokens on disk: made by `orchestra-sup keys init --http-token NAME`,
checked by the supervisor's HTTP server for every request (issue 23).

A token is `osup_<name>_<secret>`: the name says whose it is (and finds its record at once), the
secret is 32 random bytes (`secrets.token_urlsafe`). It is printed once, when made, and never
kept: the keys directory holds only its SHA-256, in `http-tokens/<name>.toml` (0600, in the
0700 keys directory) with its role. A fast hash is enough for a 256-bit random secret: nothing
can be guessed by trying (OWASP's password-storage advice, for slow hashes, is about secrets
people choose). The comparison is constant-time (`hmac.compare_digest`).

Roles: `read` sees everything and changes nothing; `operate` (the default) may also submit,
cancel, answer, message, restart, roll over and reload.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol.keys import check_name

TOKENS_DIR = "http-tokens"
RECORD_MAX = 4096
"""Bytes a token file may hold (its two lines are about 90)."""
READ, OPERATE = "read", "operate"
ROLES = (READ, OPERATE)
PREFIX = "osup_"
_TOKEN = re.compile(r"osup_([A-Za-z0-9][A-Za-z0-9_.-]{0,63})_([A-Za-z0-9_-]{43})")


@dataclass(frozen=True, slots=True)
class Token:
    """A token that was checked: whose it is (`name`) and what it may do (`role`)."""

    name: str
    role: str

    @property
    def operates(self) -> bool:
        return self.role == OPERATE


def issue_token(keys_dir: Path, name: str, role: str = OPERATE) -> str:
    """Make token `name` with `role` in `keys_dir` (made 0700 if missing) and return it (the
    only time it is seen). Raises `ConfigError` for a bad name (`keys.check_name`) or role, a
    name that has a token already (never replaced: revoke by deleting its file), or a file
    that cannot be written."""
    check_name(name)
    if role not in ROLES:
        raise ConfigError(f"token role {role!r}: expected one of {', '.join(ROLES)}")
    secret = secrets.token_urlsafe(32)
    token = f"{PREFIX}{name}_{secret}"
    path = keys_dir / TOKENS_DIR / f"{name}.toml"
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(keys_dir, 0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise ConfigError(
            f"HTTP token {name!r} exists in {keys_dir} (delete {path} to revoke it)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"keys directory {keys_dir}: {exc.strerror}") from exc
    with os.fdopen(fd, "w") as out:
        out.write(f'role = "{role}"\nsha256 = "{_digest(token)}"\n')
    return token


class TokenTable:
    """The tokens of `keys_dir` as they are on disk when presented: `check(bearer)` looks at
    the file of the name the token carries, so a token made with `keys init` is admitted at
    once and one whose file is deleted (revoked) is refused at once, with no restart or
    reload. One `stat` per request; a file is read again only when it changed."""

    def __init__(self, keys_dir: Path) -> None:
        self.dir = keys_dir / TOKENS_DIR
        self._read: dict[str, tuple[tuple[int, int, int], str, str]] = {}
        """name -> ((inode, mtime ns, size), role, sha256 hex), as last read."""

    @classmethod
    def load(cls, keys_dir: Path) -> tuple[TokenTable, list[str]]:
        """The table, each token file read once now, and a line for each that cannot be read
        or says nonsense (its token is refused, as at any request: one damaged file must not
        keep the API, or a re-exec of the tree, from starting)."""
        table, damaged = cls(keys_dir), []
        for path in sorted(table.dir.glob("*.toml")) if table.dir.is_dir() else ():
            try:
                table._record(path.stem)
            except ConfigError as exc:
                damaged.append(str(exc))
        return table, damaged

    def __len__(self) -> int:
        """Token files in the keys directory now."""
        return len(list(self.dir.glob("*.toml"))) if self.dir.is_dir() else 0

    def check(self, bearer: str) -> Token | None:
        """Whose `bearer` is, or None: not a token's shape, no file for its name (never made,
        or revoked), an unreadable file, or a secret that is not the one hashed there."""
        match = _TOKEN.fullmatch(bearer)
        if match is None:
            return None
        name = match.group(1)
        try:
            role, digest = self._record(name)
        except ConfigError:
            self._read.pop(name, None)
            return None
        if not hmac.compare_digest(digest, _digest(bearer)):
            return None
        return Token(name=name, role=role)

    def _record(self, name: str) -> tuple[str, str]:
        """(role, digest) of token `name`, read again when its file changed. Raises
        `ConfigError` when the file is missing, unreadable or says nonsense."""
        path = self.dir / f"{name}.toml"
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ConfigError(f"HTTP token {path}: {exc.strerror}") from None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._read.get(name)
        if known is not None and known[0] == stamp:
            return known[1], known[2]
        try:
            data = tomllib.loads(_read_small(path))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"HTTP token {path}: cannot be read: {exc}") from exc
        role, digest = data.get("role"), data.get("sha256")
        if role not in ROLES or not isinstance(digest, str) or len(digest) != 64:
            raise ConfigError(f"HTTP token {path}: needs role (read|operate) and sha256")
        self._read[name] = (stamp, role, digest)
        return role, digest


def _read_small(path: Path) -> str:
    """A token file's text: a regular file of at most `RECORD_MAX` bytes. It is read on the
    supervisor's loop, so nothing else may be: a FIFO would block it, /dev/zero fill memory.
    Raises `OSError` (ValueError's text for the rest)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > RECORD_MAX:
            raise OSError(f"not a regular file of at most {RECORD_MAX} bytes")
        return os.read(fd, RECORD_MAX).decode()
    finally:
        os.close(fd)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
