"""Small text helpers for messages: shorten, keep the last lines, timestamp."""

from __future__ import annotations

from datetime import UTC, datetime


def short(text: object, limit: int = 300) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def tail(text: str, lines: int = 25) -> str:
    """The last ``lines`` lines of a tool's output (where compilers and servers put the error)."""
    return "\n".join(text.strip().splitlines()[-lines:])


def utc_timestamp() -> str:
    """Now, in UTC, as ISO 8601 to the second (what state and status files record)."""
    return datetime.now(UTC).isoformat(timespec="seconds")
