"""Files that are never left half-written: hashes, cross-process locks, atomic files and output
directories, and the one cache pattern (lock, build aside, rename) every cached artifact uses."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from edgepack.errors import OutputExistsError


def file_sha256(path: Path | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def file_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created if needed): one builder at a time, across processes."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def check_output_dir(path: Path, force: bool) -> None:
    """Fail before any work if ``path`` exists and may not be replaced."""
    if Path(path).exists() and not force:
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


@contextmanager
def atomic_file(path: Path | str) -> Iterator[Path]:
    """A temporary path beside ``path`` for the caller to write; when the block ends without an error the
    file is flushed to disk and renamed to ``path`` (a reader sees the old file or the whole new one, also
    after a crash), otherwise removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path | str, text: str) -> None:
    """Write a text file through ``atomic_file``."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: Path | str, data) -> None:
    """Write ``data`` as indented JSON (keys sorted) through ``atomic_file``."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def cached_directory(root: Path, make: Callable[[Path], None], *,
                     complete: Callable[[Path], bool] | None = None) -> Path:
    """The cache entry ``root``: returned at once when it is complete, else made by ``make(staging)``.

    The one cache pattern of edgepack: check, take the entry's lock (one builder per entry across
    processes), check again, build into a temporary directory beside ``root`` and rename it into
    place, so that an entry only ever appears complete. ``complete`` tells a finished entry
    (default: ``root`` exists); an incomplete leftover is removed before building again.
    """
    root = Path(root)
    done = complete or (lambda p: p.is_dir())
    if done(root):
        return root
    with file_lock(root.parent / f".{root.name}.lock"):
        if done(root):
            return root
        shutil.rmtree(root, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.partial-", dir=root.parent))
        try:
            make(staging)
            staging.chmod(0o755)
            os.rename(staging, root)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return root
