"""Find the external tools a profile needs: cross compilers and emulators.

Modeled on ``tvm.support.cc``/``tvm.support.ndk``: small helpers that locate a tool, tell what
package provides it when it is missing, and run it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgepack.errors import ToolchainError
from edgepack.profiles import Profile


@dataclass(frozen=True)
class Compilers:
    cc: str  # absolute paths
    cxx: str
    version: str


def _ndk_bin_dir(ndk: str | None) -> Path | None:
    root = ndk or os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
    if not root:
        return None
    return Path(root).expanduser() / "toolchains" / "llvm" / "prebuilt" / "linux-x86_64" / "bin"


def find_compilers(profile: Profile, ndk: str | None = None) -> Compilers:
    """The profile's C and C++ compilers, or a ToolchainError telling how to install them."""
    tc = profile.toolchain
    if tc.ndk:
        override = os.environ.get("TVM_NDK_CC")
        bin_dir = _ndk_bin_dir(ndk)
        if override:
            cxx = shutil.which(override)
            cc = cxx
        elif bin_dir is not None:
            cc = shutil.which(tc.cc, path=str(bin_dir))
            cxx = shutil.which(tc.cxx, path=str(bin_dir))
        else:
            cc = cxx = None
        if not cc or not cxx:
            raise ToolchainError(
                f"Profile {profile.name!r} builds with the Android NDK's clang ({tc.cxx}), which was not found"
                + (f" in {bin_dir}." if bin_dir else "."),
                "Download the Android NDK (r26 or newer) and pass --ndk /path/to/ndk, or set ANDROID_NDK_HOME,"
                " or set TVM_NDK_CC to the full path of aarch64-linux-android24-clang++.",
            )
    else:
        cc, cxx = shutil.which(tc.cc), shutil.which(tc.cxx)
        if not cc or not cxx:
            missing = tc.cxx if not cxx else tc.cc
            package = f"`apt-get install {tc.apt_package}`" if tc.apt_package else "your distribution's package"
            raise ToolchainError(
                f"The cross compiler {missing} for profile {profile.name!r} ({profile.triple}) is not installed.",
                f"Install it with {package}, then run `edgepack doctor` to check.",
            )
    return Compilers(cc=cc, cxx=cxx, version=tool_version(cxx))


def tool_version(executable: str) -> str:
    try:
        out = subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    lines = (out.stdout or out.stderr).strip().splitlines()
    return lines[0] if lines else "unknown"


def emulator_command(profile: Profile) -> list[str]:
    """The argv prefix that runs the profile's binaries here (empty for native ones)."""
    if profile.is_host:
        return []
    if profile.emulator is None:
        raise ToolchainError(
            f"Profile {profile.name!r} ({profile.triple}) has no emulator: its binaries cannot run on this machine.",
            "Run it on a real device (`edgepack device add`), or use an ARM Linux profile such as rpi4 or rpi3.",
        )
    command = list(profile.emulator.command)
    if not shutil.which(command[0]):
        package = profile.emulator.apt_package or "qemu-user"
        raise ToolchainError(
            f"The emulator {command[0]} for profile {profile.name!r} is not installed.",
            f"Install it with `apt-get install {package}`.",
        )
    return command
