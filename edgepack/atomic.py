"""Write output directories so that an interrupted run never leaves one that looks complete."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgepack.errors import OutputExistsError


def check_output_dir(path: Path, force: bool) -> None:
    """Fail before any work if ``path`` exists and may not be replaced."""
    if path.exists() and not force:
        raise OutputExistsError(
            f"Output directory {path} already exists.",
            "Pass --force to replace it, or choose another -o/--output.",
        )


@contextmanager
def atomic_directory(path: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; rename it to ``path`` only if the block succeeds.

    The temporary directory lives in the same parent, so the final rename is atomic on POSIX.
    An existing ``path`` is replaced only with ``force``, and only after the new one is complete.
    """
    path = Path(path).absolute()
    check_output_dir(path, force)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
    try:
        yield staging
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result should not be
        if path.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
            path.rename(retired / path.name)
            staging.rename(path)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write a file through a temporary name and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
