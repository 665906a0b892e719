"""``edgepack doctor``: which toolchains, emulators and optional pieces are present."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from edgepack.errors import EdgepackError
from edgepack.profiles import get_profile, list_profiles
from edgepack.toolchain import find_compilers, tool_version

PINNED = {"apache-tvm": "0.27.0.post1", "apache-tvm-ffi": "0.1.14.post1"}


@dataclass(frozen=True)
class Check:
    group: str
    name: str
    ok: bool
    detail: str
    hint: str = ""
    required: bool = False  # a missing required piece breaks `edgepack compile` itself

    def to_dict(self) -> dict:
        return asdict(self)


def _package(name: str, purpose: str, required: bool = False) -> Check:
    try:
        found = version(name)
    except PackageNotFoundError:
        return Check("python", name, False, "not installed", f"pip install {name}  ({purpose})", required)
    pinned = PINNED.get(name)
    if pinned and found != pinned:
        return Check("python", name, False, f"{found} (edgepack needs {pinned})",
                     f"pip install {name}=={pinned}", required)
    return Check("python", name, True, f"{found}  ({purpose})", required=required)


def _tool(group: str, executable: str, purpose: str, apt: str | None) -> Check:
    path = shutil.which(executable)
    if not path:
        return Check(group, executable, False, f"not found ({purpose})",
                     f"apt-get install {apt}" if apt else "")
    return Check(group, executable, True, f"{tool_version(path)}  ({purpose})")


def _binfmt() -> Check:
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if entry.exists() and "enabled" in entry.read_text():
        return Check("emulation", "binfmt_misc qemu-aarch64", True, "ARM binaries run directly")
    return Check("emulation", "binfmt_misc qemu-aarch64", False,
                 "not registered (edgepack calls qemu explicitly; the SSH farm needs it)",
                 "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; update-binfmts --enable qemu-aarch64")


def run_checks() -> list[Check]:
    checks = [
        _package("apache-tvm", "the compiler", required=True),
        _package("apache-tvm-ffi", "TVM's runtime ABI", required=True),
        _package("onnx", "ONNX import", required=True),
        _package("tflite", "TFLite import"),
        _package("onnxruntime", "ONNX reference for validation"),
        _package("ai-edge-litert", "TFLite reference for validation"),
        _package("paramiko", "remote devices over SSH"),
    ]
    seen: set[str] = set()
    for profile in list_profiles():
        tc = profile.toolchain
        if tc.ndk or tc.cxx in seen:
            continue
        seen.add(tc.cxx)
        users = ", ".join(p.name for p in list_profiles() if p.toolchain.cxx == tc.cxx)
        checks.append(_tool("compilers", tc.cxx, f"for {users}", tc.apt_package))
    for profile in list_profiles():
        if profile.emulator and profile.emulator.command[0] not in seen:
            seen.add(profile.emulator.command[0])
            users = ", ".join(p.name for p in list_profiles()
                              if p.emulator and p.emulator.command[0] == profile.emulator.command[0])
            checks.append(_tool("emulation", profile.emulator.command[0], f"runs {users}",
                                profile.emulator.apt_package))
    checks.append(_binfmt())
    checks.append(_tool("build", "cmake", "C bundles", "cmake"))
    checks.append(_tool("build", "javac", "Android/JNI bindings", "openjdk-17-jdk-headless"))
    checks.append(_ndk())
    return checks


def _ndk() -> Check:
    try:
        compilers = find_compilers(get_profile("android-arm64"))
    except EdgepackError as exc:
        return Check("compilers", "Android NDK", False, "not found (for android-arm64)", exc.hint)
    return Check("compilers", "Android NDK", True, f"{compilers.version}  ({compilers.cxx})")
