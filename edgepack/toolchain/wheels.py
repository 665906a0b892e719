"""Pinned wheels from PyPI, downloaded once with pip and checked against their recorded SHA-256.

edgepack takes prebuilt native libraries out of wheels (TVM's official aarch64 runtime, wgpu-native);
the wheel itself is never installed. A download with another digest is deleted and refused.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgepack.errors import ToolchainError
from edgepack.files import file_sha256
from edgepack.progress import Progress
from edgepack.toolchain.process import run, tail


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel file of a pinned release, as recorded from PyPI."""

    requirement: str  # e.g. "apache-tvm==0.27.0.post1"
    filename: str
    sha256: str
    platform: str  # pip --platform, e.g. "manylinux_2_28_aarch64"
    python_version: str | None = None  # pip --python-version, for wheels that are not py3-none


def fetch_wheel(wheel: PinnedWheel, downloads: Path, *, purpose: str, log: Progress | None = None) -> Path:
    """``downloads/<filename>``: fetched with ``pip download`` unless already there, SHA-256 checked.

    ``purpose`` says what the wheel is for, in messages ("the official aarch64-linux-gnu runtime").
    """
    downloads.mkdir(parents=True, exist_ok=True)
    path = downloads / wheel.filename
    if not path.is_file() or file_sha256(path) != wheel.sha256:
        if log:
            log(f"Downloading {purpose}: {wheel.requirement} ({wheel.platform})")
        with tempfile.TemporaryDirectory(dir=downloads) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--platform", wheel.platform, "--disable-pip-version-check", "-d", tmp, wheel.requirement]
            if wheel.python_version:
                cmd[-3:-3] = ["--python-version", wheel.python_version]
            result = run(cmd)
            got = Path(tmp) / wheel.filename
            if result.returncode != 0 or not got.is_file():
                raise ToolchainError(
                    f"Downloading {wheel.requirement} ({wheel.platform}) from PyPI for {purpose} failed.",
                    "It needs access to PyPI (or a pip index configured in pip.conf); or run scripts/setup.sh "
                    "once online.\n" + tail(result.stdout + result.stderr, 8),
                )
            os.replace(got, path)
    digest = file_sha256(path)
    if digest != wheel.sha256:
        path.unlink(missing_ok=True)
        raise ToolchainError(
            f"{wheel.filename} has SHA-256 {digest}, expected {wheel.sha256}.",
            "The download is not the release edgepack was tested with; it was deleted. Check your pip index.",
        )
    return path
