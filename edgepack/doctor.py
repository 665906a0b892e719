"""``edgepack doctor``: which toolchains, emulators and optional pieces are present."""

from __future__ import annotations

import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from edgepack.backends import backends
from edgepack.errors import EdgepackError
from edgepack.profiles import get_profile, list_profiles
from edgepack.toolchain.compilers import find_compilers, tool_version
from edgepack.versions import PINNED_PACKAGES, installed_version


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    version: str  # short version, or what is wrong
    purpose: str
    hint: str = ""
    required: bool = False  # a missing required piece breaks `edgepack compile` itself

    def to_dict(self) -> dict:
        return asdict(self)


def short_version(line: str) -> str:
    """'aarch64-linux-gnu-g++ (Debian 12.2.0-14) 12.2.0' -> '12.2.0'."""
    numbers = re.findall(r"\d+\.\d+(?:\.\d+)*", line)
    dotted = [n for n in numbers if n.count(".") >= 2]
    return (dotted or numbers or [line])[0]


def _package(name: str, purpose: str, required: bool = False) -> Check:
    found = installed_version(name)
    if found is None:
        return Check(name, False, "not installed", purpose, f"pip install {name}", required)
    pinned = PINNED_PACKAGES.get(name)
    if pinned and found != pinned:
        return Check(name, False, f"{found}, needs {pinned}", purpose, f"pip install {name}=={pinned}", required)
    return Check(name, True, found, purpose, required=required)


def _tool(executable: str, purpose: str, apt: str | None) -> Check:
    path = shutil.which(executable)
    if not path:
        return Check(executable, False, "not found", purpose, f"apt-get install {apt}" if apt else "")
    return Check(executable, True, short_version(tool_version(path)), purpose)


def _binfmt() -> Check:
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    purpose = "ARM binaries run directly (the SSH device farm needs it)"
    if entry.exists() and "enabled" in entry.read_text():
        return Check("binfmt_misc", True, "qemu-aarch64 enabled", purpose)
    return Check("binfmt_misc", False, "not registered", purpose,
                 "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc && update-binfmts --enable qemu-aarch64")


def _backend_checks() -> list[Check]:
    """What each backend needs on this machine (a GPU driver for host-opencl / host-vulkan)."""
    found = []
    for backend in backends().values():
        check = backend.doctor_check()
        if check is not None:
            found.append(Check(check.name, check.ok, check.found, check.purpose, check.hint))
    return found


def _ndk() -> Check:
    try:
        compilers = find_compilers(get_profile("android-arm64"))
    except EdgepackError as exc:
        return Check("Android NDK", False, "not found", "android-arm64 builds", exc.hint)
    return Check("Android NDK", True, short_version(compilers.version), "android-arm64 builds")


def run_checks() -> list[Check]:
    checks = [
        _package("apache-tvm", "the compiler", required=True),
        _package("apache-tvm-ffi", "TVM's runtime ABI", required=True),
        _package("onnx", "ONNX import", required=True),
        _package("tflite", "TFLite import"),
        _package("onnxruntime", "ONNX reference"),
        _package("ai-edge-litert", "TFLite reference"),
        _package("paramiko", "remote devices over SSH"),
    ]
    profiles = [p for p in list_profiles() if not p.toolchain.ndk]
    for cxx in dict.fromkeys(p.toolchain.cxx for p in profiles):
        users = [p for p in profiles if p.toolchain.cxx == cxx]
        checks.append(_tool(cxx, "compiler for " + ", ".join(p.name for p in users), users[0].toolchain.apt_package))
    emulated = [p for p in profiles if p.emulator]
    for qemu in dict.fromkeys(p.emulator.command[0] for p in emulated):
        users = [p for p in emulated if p.emulator.command[0] == qemu]
        checks.append(_tool(qemu, "runs " + ", ".join(p.name for p in users), users[0].emulator.apt_package))
    checks += [_binfmt(), *_backend_checks(), _tool("cmake", "C bundles", "cmake"),
               _tool("javac", "Java/JNI bindings", "openjdk-17-jdk-headless"), _ndk()]
    return checks
