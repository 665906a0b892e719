"""The Android NDK: its ABIs (what their libraries look like, how to build for them) and its clang."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack.errors import ToolchainError
from edgepack.profiles import Profile, with_llvm_workarounds
from edgepack.toolchain.compilers import find_compilers

MIN_SDK = 24

EM_386, EM_ARM, EM_X86_64, EM_AARCH64 = 3, 40, 62, 183


@dataclass(frozen=True)
class AbiSpec:
    """One Android ABI: how its libraries look and how to build for it."""

    name: str  # the directory name in jni/ and lib/
    machine: int  # ELF e_machine
    elf_class: int  # 1: 32-bit, 2: 64-bit
    triple: str  # the triple of the runtime cache and the NDK clang prefix (before the API level)
    sysroot_triple: str  # directory of sysroot/usr/lib/<triple>/ holding libc++_shared.so
    tvm_target: dict[str, Any]  # TVM target of the model library
    runtime_flags: tuple[str, ...] = ()  # compiler flags of the TVM runtime build


ABIS: dict[str, AbiSpec] = {
    "arm64-v8a": AbiSpec("arm64-v8a", EM_AARCH64, 2, "aarch64-linux-android", "aarch64-linux-android",
                         {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": ["+neon"]}),
    # armeabi-v7a: soft-float calling convention (softfp) with NEON, as the NDK builds it
    # (with the pinned LLVM's 32-bit ARM workarounds: profiles.with_llvm_workarounds, docs/armv7.md)
    "armeabi-v7a": AbiSpec("armeabi-v7a", EM_ARM, 1, "armv7a-linux-androideabi", "arm-linux-androideabi",
                           with_llvm_workarounds({"kind": "llvm", "mtriple": "armv7a-linux-androideabi",
                                                  "mattr": ["+neon"]}),
                           ("-march=armv7-a", "-mfloat-abi=softfp", "-mfpu=neon")),
    # x86_64: the Android emulator; the ABI guarantees SSE4.2 and POPCNT
    "x86_64": AbiSpec("x86_64", EM_X86_64, 2, "x86_64-linux-android", "x86_64-linux-android",
                      {"kind": "llvm", "mtriple": "x86_64-linux-android", "mattr": ["+sse4.2", "+popcnt"]}),
}
#: What ``assemble_aar`` accepts (x86 too, though edgepack does not build for it).
ABI_MACHINES: dict[str, tuple[int, int]] = {
    **{name: (spec.machine, spec.elf_class) for name, spec in ABIS.items()},
    "x86": (EM_386, 1),
}
MACHINE_NAMES = {EM_386: "x86 (EM_386)", EM_ARM: "32-bit ARM (EM_ARM)", EM_X86_64: "x86-64 (EM_X86_64)",
                  EM_AARCH64: "AArch64 (EM_AARCH64)"}

@dataclass(frozen=True)
class Ndk:
    bin_dir: Path  # toolchains/llvm/prebuilt/<host>/bin
    api_level: int
    primary_cc: str  # the compilers find_compilers found for the build's profile
    primary_cxx: str

    @property
    def sysroot(self) -> Path:
        return self.bin_dir.parent / "sysroot"

    def compilers(self, abi: AbiSpec, primary: bool) -> tuple[str, str]:
        """The C and C++ compilers for ``abi``; ``primary``: those found for the build's profile."""
        if primary:
            return self.primary_cc, self.primary_cxx
        cc = self.bin_dir / f"{abi.triple}{self.api_level}-clang"
        cxx = self.bin_dir / f"{abi.triple}{self.api_level}-clang++"
        if not cc.exists() or not cxx.exists():
            raise ToolchainError(f"The NDK in {self.bin_dir.parent.parent.parent.parent} has no {cc.name} for {abi.name}.",
                                 "Pass the NDK root with --ndk (TVM_NDK_CC only names the arm64 compiler).")
        return str(cc), str(cxx)


def _c_compiler(cxx: str) -> str:
    """The C compiler beside a C++ one (TVM_NDK_CC names the C++ compiler only)."""
    for plus, plain in (("clang++", "clang"), ("g++", "gcc")):
        if cxx.endswith(plus):
            found = shutil.which(cxx[: -len(plus)] + plain)
            if found:
                return found
    return cxx


def find_ndk(profile: Profile, ndk: str | None) -> Ndk:
    """The NDK clang of ``profile`` (``--ndk``, ``$ANDROID_NDK_HOME``, ``$ANDROID_NDK_ROOT`` or
    ``$TVM_NDK_CC``), or a ToolchainError telling how to provide it."""
    try:
        compilers = find_compilers(profile, ndk=ndk)
    except ToolchainError as exc:
        given = ndk or os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
        where = (f"No NDK clang ({profile.toolchain.cxx}) was found under {given}." if given else
                 "No Android NDK was given: --ndk is missing and ANDROID_NDK_HOME, ANDROID_NDK_ROOT and"
                 " TVM_NDK_CC are not set.")
        raise ToolchainError(
            "`edgepack package android` needs the Android NDK: its clang builds the JNI layer and the TVM"
            f" runtime for Android, and edgepack never puts a non-Android library into an AAR. {where}",
            "Install the NDK (r26 or newer; Android Studio > SDK Manager > SDK Tools > NDK, or"
            " https://developer.android.com/ndk/downloads) and pass --ndk /path/to/android-ndk-r27c, or"
            " export ANDROID_NDK_HOME=/path/to/android-ndk-r27c, or set TVM_NDK_CC to the full path of"
            f" {profile.toolchain.cxx}.",
        ) from exc
    cxx = compilers.cxx
    cc = compilers.cc if compilers.cc != cxx else _c_compiler(cxx)
    match = re.search(r"(\d+)-clang", Path(cxx).name)
    return Ndk(bin_dir=Path(os.path.realpath(cxx)).parent, api_level=int(match.group(1)) if match else MIN_SDK,
               primary_cc=cc, primary_cxx=cxx)
