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
import tomllib
from dataclasses import dataclass
from pathlib import Path

from orchestra_sup.errors import ConfigError
from orchestra_sup.protocol.keys import check_name

TOKENS_DIR = "http-tokens"
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
    """The tokens of `keys_dir`, read once (`load`); `check(bearer)` says whose a presented
    token is, or None. A token added or deleted later takes effect when the table is read
    again: at the supervisor's next start (or re-exec)."""

    def __init__(self, tokens: dict[str, tuple[str, str]]) -> None:
        self._tokens = tokens  # name -> (role, sha256 hex)

    @classmethod
    def load(cls, keys_dir: Path) -> TokenTable:
        """Raises `ConfigError` for a token file that cannot be read or says nonsense."""
        tokens: dict[str, tuple[str, str]] = {}
        where = keys_dir / TOKENS_DIR
        if not where.is_dir():
            return cls(tokens)
        for path in sorted(where.glob("*.toml")):
            try:
                data = tomllib.loads(path.read_text())
            except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"HTTP token {path}: cannot be read: {exc}") from exc
            role, digest = data.get("role"), data.get("sha256")
            if role not in ROLES or not isinstance(digest, str) or len(digest) != 64:
                raise ConfigError(f"HTTP token {path}: needs role (read|operate) and sha256")
            tokens[path.stem] = (role, digest)
        return cls(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def check(self, bearer: str) -> Token | None:
        match = _TOKEN.fullmatch(bearer)
        if match is None:
            return None
        name = match.group(1)
        known = self._tokens.get(name)
        if known is None or not hmac.compare_digest(known[1], _digest(bearer)):
            return None
        return Token(name=name, role=known[0])


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
