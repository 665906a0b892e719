"""Find the external tools a profile needs: cross compilers, archivers and emulators.

Modeled on ``tvm.support.cc``/``tvm.support.ndk``: small helpers that locate a tool, tell what
package provides it when it is missing, and say how it was configured.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from edgepack.errors import ToolchainError
from edgepack.profiles import Profile

HOST_TRIPLE = "x86_64-linux-gnu"

#: Compiler flags a triple needs on top of the compiler's defaults. armhf: Debian's
#: arm-linux-gnueabihf-gcc defaults to ARMv7 + VFPv3-D16; the TVM targets edgepack uses for armv7
#: assume NEON + VFPv4 (Cortex-A7 and newer), so the runtime is built for the same.
DEFAULT_TARGET_FLAGS: dict[str, tuple[str, ...]] = {
    "arm-linux-gnueabihf": ("-march=armv7-a", "-mfpu=neon-vfpv4", "-mfloat-abi=hard"),
    "armv7a-linux-gnueabihf": ("-march=armv7-a", "-mfpu=neon-vfpv4", "-mfloat-abi=hard"),
}

#: Debian package that provides the cross compilers for a triple (for error hints).
DEBIAN_COMPILER_PACKAGES: dict[str, str] = {
    "aarch64-linux-gnu": "g++-aarch64-linux-gnu",
    "arm-linux-gnueabihf": "g++-arm-linux-gnueabihf",
    "armv7a-linux-gnueabihf": "g++-arm-linux-gnueabihf",
    "riscv64-linux-gnu": "g++-riscv64-linux-gnu",
    "x86_64-linux-gnu": "g++",
}



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


def target_flags(triple: str) -> tuple[str, ...]:
    """The compiler flags code for ``triple`` is built with (see ``DEFAULT_TARGET_FLAGS``)."""
    return DEFAULT_TARGET_FLAGS.get(triple, ())


def require_tool(tool: str, triple: str | None = None) -> str:
    """The full path of ``tool``, or a ToolchainError naming the package that provides it."""
    path = shutil.which(tool)
    if path:
        return path
    package = DEBIAN_COMPILER_PACKAGES.get(triple or "", "") if triple else ""
    if tool == "cmake":
        hint = "Install CMake >= 3.16: `apt-get install cmake` or `pip install cmake`."
    elif package:
        hint = f"Install the cross compiler with `apt-get install {package}`."
    else:
        hint = "Install it, or pass the full path of the compiler."
    raise ToolchainError(f"{tool} is not installed (needed to build for {triple or 'this machine'}).", hint)


def compiler_identity(cc: str) -> dict[str, str]:
    """What makes two compilers produce different code: resolved path, version and target."""
    path = os.path.realpath(shutil.which(cc) or cc)
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
        machine = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True, timeout=30,
                                 check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = machine = ""
    return {"path": path, "version": (version.splitlines() or [""])[0], "machine": machine.strip()}


def archiver(cc: str) -> str:
    """The ``ar`` that matches ``cc`` (host ar cannot index foreign objects)."""
    name = Path(cc).name
    directory = Path(cc).parent if os.sep in cc else None
    candidates = []
    for suffix in ("gcc", "clang", "cc", "g++", "c++"):
        if name.endswith(suffix) and len(name) > len(suffix):
            stem = name[: -len(suffix)]
            candidates += [stem + "gcc-ar" if suffix == "gcc" else "", stem + "ar"]
            break
    candidates += ["llvm-ar"] if "clang" in name else []
    candidates.append("ar")
    for c in filter(None, candidates):
        found = shutil.which(c, path=str(directory)) if directory else None
        found = found or shutil.which(c)
        if found:
            return found
    raise ToolchainError(f"No archiver (ar) found for {cc}.", "Install binutils for the target triple.")


def c_compiler_for(cxx: str) -> str:
    for a, b in (("g++", "gcc"), ("clang++", "clang"), ("c++", "cc")):
        if cxx.endswith(a):
            return cxx[: -len(a)] + b
    return cxx



def host_compilers() -> tuple[str, str]:
    """(cc, cxx) of this machine, for the host plug-ins and host programs."""
    for cc, cxx in (("gcc", "g++"), ("cc", "c++"), ("clang", "clang++")):
        if shutil.which(cxx):
            return cc, cxx
    raise ToolchainError("No C++ compiler found to build edgepack's native code for this machine.",
                         "Install one: `apt-get install g++ cmake`.")
