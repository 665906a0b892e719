"""The one progress callback type: long operations report each step as a line of text."""

from __future__ import annotations

from collections.abc import Callable

#: Called with a short sentence when a step starts ("Building for rpi4 (aarch64-linux-gnu)").
Progress = Callable[[str], None]


def silent(_message: str) -> None:
    """A :data:`Progress` that shows nothing."""


def reporter(progress: Progress | None) -> Progress:
    """``progress``, or :func:`silent` when there is none."""
    return progress if progress is not None else silent
