"""Reading the ELF headers of native libraries: the machine (so a library for the wrong ABI never ends up in
an AAR), LOAD alignment (16 KiB pages) and the libraries each one needs."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

from edgepack.errors import EdgepackError
from edgepack.toolchain.android_ndk import ABI_MACHINES, MACHINE_NAMES

#: Libraries every Android device provides (NDK stable APIs); anything else a library needs must
#: be in the same ABI directory.
ANDROID_SYSTEM_LIBS = frozenset({
    "libc.so", "libm.so", "libdl.so", "liblog.so", "libz.so", "libandroid.so", "libjnigraphics.so",
    "libEGL.so", "libGLESv2.so", "libGLESv3.so", "libvulkan.so", "libOpenSLES.so", "libaaudio.so",
    "libmediandk.so", "libnativewindow.so", "libneuralnetworks.so", "libsync.so", "libcamera2ndk.so",
    "libstdc++.so", "libamidi.so", "libbinder_ndk.so",
})


# ----------------------------------------------------------------------------------------------
# ELF


@dataclass(frozen=True)
class ElfInfo:
    machine: int
    elf_class: int  # 1: 32-bit, 2: 64-bit
    elf_type: int  # 3: ET_DYN
    needed: tuple[str, ...]
    soname: str | None
    min_load_align: int  # smallest p_align of the PT_LOAD segments (16 KiB pages need >= 16384)


def read_elf(path: Path) -> ElfInfo:
    """Machine, class, type, DT_NEEDED, DT_SONAME and LOAD alignment of an ELF file (little endian)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        raise EdgepackError(f"{path} is not an ELF file.", "Only shared libraries (.so) can go into jni/<abi>/.")
    elf_class, endian = data[4], data[5]
    if endian != 1:
        raise EdgepackError(f"{path} is a big-endian ELF file; Android ABIs are little endian.")
    if elf_class == 2:
        e_type, e_machine = struct.unpack_from("<HH", data, 16)
        e_phoff, = struct.unpack_from("<Q", data, 32)
        e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
        ph_fmt, dyn_fmt, dyn_size = "<IIQQQQQQ", "<qQ", 16
    else:
        e_type, e_machine = struct.unpack_from("<HH", data, 16)
        e_phoff, = struct.unpack_from("<I", data, 28)
        e_phentsize, e_phnum = struct.unpack_from("<HH", data, 42)
        ph_fmt, dyn_fmt, dyn_size = "<IIIIIIII", "<iI", 8
    loads, dynamic = [], None
    for i in range(e_phnum):
        fields = struct.unpack_from(ph_fmt, data, e_phoff + i * e_phentsize)
        if elf_class == 2:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, p_align = fields
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _flags, p_align = fields
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz, p_align))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)

    def file_offset(vaddr: int) -> int | None:
        for v, off, size, _align in loads:
            if v <= vaddr < v + max(size, 1):
                return vaddr - v + off
        return None

    needed_offsets, soname_offset, strtab = [], None, None
    if dynamic is not None:
        off, size = dynamic
        for pos in range(off, off + size, dyn_size):
            tag, value = struct.unpack_from(dyn_fmt, data, pos)
            if tag == 0:
                break
            if tag == 1:
                needed_offsets.append(value)
            elif tag == 14:
                soname_offset = value
            elif tag == 5:
                strtab = file_offset(value)

    def string(at: int) -> str:
        end = data.index(b"\0", strtab + at)
        return data[strtab + at:end].decode("utf-8", "replace")

    needed = tuple(string(o) for o in needed_offsets) if strtab is not None else ()
    soname = string(soname_offset) if strtab is not None and soname_offset is not None else None
    return ElfInfo(e_machine, elf_class, e_type, needed, soname, min((a for *_, a in loads), default=0))


def _machine_name(machine: int) -> str:
    return MACHINE_NAMES.get(machine, f"e_machine {machine}")


def check_abi_library(abi: str, path: Path) -> ElfInfo:
    """Refuse a library whose name is not ``lib*.so`` or whose ELF machine/class/type does not
    match the ABI directory it goes into."""
    path = Path(path)
    if not (path.name.startswith("lib") and path.name.endswith(".so")):
        raise EdgepackError(f"{path.name} is not named lib*.so; Android only installs such files from jni/<abi>/.",
                            "Rename the library.")
    return check_elf_for_abi(abi, path)


def check_elf_for_abi(abi: str, path: Path) -> ElfInfo:
    """Refuse a file that is not a shared library for ``abi`` (ELF machine, class and type)."""
    if abi not in ABI_MACHINES:
        raise EdgepackError(f"Unknown Android ABI {abi!r}.", "Use one of: " + ", ".join(ABI_MACHINES) + ".")
    path = Path(path)
    info = read_elf(path)
    machine, elf_class = ABI_MACHINES[abi]
    if info.machine != machine or info.elf_class != elf_class:
        raise EdgepackError(
            f"{path} is built for {_machine_name(info.machine)}, {32 if info.elf_class == 1 else 64}-bit; "
            f"jni/{abi}/ needs {_machine_name(machine)}, {32 if elf_class == 1 else 64}-bit.",
            "Build the library for that ABI with the Android NDK (edgepack package android --abi ...).",
        )
    if info.elf_type != 3:
        raise EdgepackError(f"{path} is not a shared library (ELF type {info.elf_type}).",
                            "Only shared libraries (.so) can go into an AAR.")
    return info


