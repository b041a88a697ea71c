"""What the built-in coordinator programs read of a lane's final result (`Context.wait`'s
answer: "status", "exit_code", "output_tail", ...): its summary, its last line of output, and
how it ended in one line for a failure's text.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ended", "last_line", "summary"]


def summary(outcome: dict[str, Any]) -> dict[str, Any]:
    """{"status", "exit_code", "output_tail"} of a lane's final result `outcome`."""
    return {
        "status": outcome["status"],
        "exit_code": outcome.get("exit_code"),
        "output_tail": outcome.get("output_tail") or "",
    }


def last_line(text: str) -> str:
    """The last non-blank line of `text`, stripped ("" when it has none)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def ended(outcome: dict[str, Any]) -> str:
    """How lane `outcome` ended, one line: "lane L failed (exit 1): <its last line of output>";
    its `error` stands in for the output when it printed nothing."""
    code = outcome.get("exit_code")
    how = f"{outcome['status']}" + (f" (exit {code})" if code is not None else "")
    said = last_line(outcome.get("output_tail") or "") or outcome.get("error") or "no output"
    return f"lane {outcome.get('lane')} {how}: {said}"
