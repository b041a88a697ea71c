"""A built-in coordinator program's `[args]` table, read and checked when the program is built.

Each built-in reads its args through one `Args` in its `__init__`; every problem is a
`ValueError` whose one line names the program and the arg (the seat refuses the plan with it
at submit, where it builds the program once to check its args):
an unknown arg (with the near name, if any), a missing one, or a value of the wrong kind.
"""

from __future__ import annotations

from typing import Any

from orchestra_sup.errors import did_you_mean

__all__ = ["Args"]

MAX_REV_LENGTH = 256
"""The longest revision an arg may name, as the custodian's history tools take them."""


def _shown(value: Any) -> str:
    """`value` as a short one-line repr with its type's name, for error messages."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = {bool: "boolean", str: "string", list: "array", dict: "table"}.get(type(value))
    return f"{text} ({kind or type(value).__name__})"


class Args:
    """The args table `args` of program `program`, taking the `required` and `optional` names.

    Raises `ValueError` for args that is not a table, an arg named in neither, or a required one
    missing."""

    def __init__(
        self,
        program: str,
        args: Any,
        *,
        required: tuple[str, ...],
        optional: tuple[str, ...] = (),
    ) -> None:
        if not isinstance(args, dict):
            raise ValueError(f"{program}: [args] must be a table, got {_shown(args)}")
        names = required + optional
        for name in args:
            if name not in names:
                raise ValueError(
                    f"{program}: unknown arg {name!r}{did_you_mean(name, names)} "
                    f"(it takes {', '.join(names)})"
                )
        for name in required:
            if name not in args:
                raise ValueError(f"{program}: missing arg {name!r} (it takes {', '.join(names)})")
        self.program = program
        self.args = args

    def _refuse(self, name: str, expected: str) -> ValueError:
        return ValueError(
            f"{self.program}: arg {name!r} must be {expected}, got {_shown(self.args[name])}"
        )

    def command(self, name: str) -> str:
        """Arg `name`, a shell command: a string holding more than whitespace, without NUL."""
        value = self.args[name]
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            raise self._refuse(name, "a shell command (a non-empty string)")
        return value

    def commands(self, name: str, *, most: int) -> list[str]:
        """Arg `name`, a list of 1 to `most` shell commands (see `command`)."""
        value = self.args[name]
        if (
            not isinstance(value, list)
            or not 1 <= len(value) <= most
            or not all(isinstance(v, str) and v.strip() and "\0" not in v for v in value)
        ):
            raise self._refuse(name, f"a list of 1 to {most} shell commands (non-empty strings)")
        return list(value)

    def given(self, name: str) -> bool:
        """Whether arg `name` is in the table."""
        return name in self.args

    def revision(self, name: str) -> str:
        """Arg `name`, one revision of the workspace (a sha, a branch, `HEAD~3`): a string of 1
        to `MAX_REV_LENGTH` characters without whitespace, not starting with "-". Whether it
        names a commit is the workspace's to say (when a lane's sandbox is made there)."""
        value = self.args[name]
        if (
            not isinstance(value, str)
            or not 0 < len(value) <= MAX_REV_LENGTH
            or value.startswith("-")
            or any(c.isspace() or not c.isprintable() for c in value)
        ):
            raise self._refuse(name, "a revision (a sha, a branch name, HEAD~3)")
        return value

    def count(self, name: str, *, default: int, least: int, most: int) -> int:
        """Arg `name`, an integer from `least` to `most` (both included); `default` when it is
        not given."""
        value = self.args.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            raise self._refuse(name, f"an integer from {least} to {most}")
        return value
