"""Driving scripts/farm.sh from tests: skip reasons, the script itself, its state."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

FARM = Path(__file__).resolve().parent.parent / "scripts" / "farm.sh"


def farm_skip_reason(*, need_cross_compiler: bool = False) -> str | None:
    if os.geteuid() != 0:
        return "the farm needs root (network namespaces, users, sshd)"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` is not available here: {probe.stderr.strip()}"
    if need_cross_compiler and shutil.which("aarch64-linux-gnu-gcc") is None:
        return "the aarch64 cross compiler is not installed"
    return None


def farm_sh(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", str(FARM), *args], check=False, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"farm.sh {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def farm_state_dir() -> Path:
    return Path(os.environ.get("EDGEPACK_FARM_DIR", "/var/lib/edgepack-farm"))


def farm_info() -> dict:
    return json.loads((farm_state_dir() / "farm.json").read_text())
