"""Running external tools (compilers, CMake, pip) and quoting what they said."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from edgepack.progress import Progress
from edgepack.text import tail

__all__ = ["run", "tail"]


def run(cmd: Sequence[str | Path], *, log: Progress | None = None, log_file: Path | None = None,
        cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` (output captured, never raising on a non-zero exit); ``log`` sees the command line,
    ``log_file`` gets the command and everything it printed."""
    if log:
        log("$ " + " ".join(str(c) for c in cmd))
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                            check=False, timeout=timeout)
    if log_file is not None:
        with log_file.open("a") as f:
            f.write("$ " + " ".join(str(c) for c in cmd) + "\n" + result.stdout + result.stderr)
    return result
