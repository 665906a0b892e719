"""A model's memory on huge pages: what loading a model adds to the process (its weights, the VM's
buffers), moved onto Linux transparent huge pages once it is loaded.

Every run reads all of a model's weights, more than the TLB covers in 4 KiB pages (MobileNetV2's
13.5 MB are 3,300 pages), and the hardware prefetchers stop at each page's end. On 2 MiB pages the
same weights are 7 pages. Measured on a Zen 4 VM as scripts/bench.py times (fresh processes, with and
without, alternating; docs/benchmarks.md): MobileNetV2 1.4% faster at 1 thread, the same at 2 within
the noise; resnet50-light (72.8 MB) 1.7% at 1 thread, 1.6% at 2.

``madvise(MADV_COLLAPSE)`` (Linux 6.1+) moves populated memory onto huge pages in place, whatever
the system's ``transparent_hugepage/enabled`` says short of ``never``; only whole huge pages that
loading the model added to the process's mappings are touched, nothing the process had before (so a
model that reuses memory the process already had, such as an earlier model's freed memory, keeps
what that memory was on). Where the kernel cannot (older kernels, other systems) nothing changes.
``EDGEPACK_HUGE_PAGES=0`` turns it off. The C API (``runtimes/api/c``) does the same for the programs
that load a model without Python.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ENV = "EDGEPACK_HUGE_PAGES"
MADV_COLLAPSE = 25  # linux/mman.h
_PMD_SIZE = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")


def huge_page_size() -> int:
    """This kernel's transparent huge page size in bytes (2 MiB on x86-64 and 4 KiB-page aarch64), 0
    where there are none or ``EDGEPACK_HUGE_PAGES=0``."""
    if os.environ.get(ENV, "").strip() == "0" or not sys.platform.startswith("linux"):
        return 0
    try:
        return int(_PMD_SIZE.read_text())
    except (OSError, ValueError):
        return 0


def _anonymous_pages(size: int) -> set[int]:
    """The whole huge pages (their numbers: address // size) inside this process's private,
    writable, anonymous mappings (the heap and mmap'ed allocations, ``[anon:...]`` where an allocator
    names them, as Android's do)."""
    pages: set[int] = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            name = fields[5] if len(fields) > 5 else ""
            if fields[1] != "rw-p" or not (name in ("", "[heap]") or name.startswith("[anon:")):
                continue
            low, high = (int(x, 16) for x in fields[0].split("-"))
            pages.update(range(-(-low // size), high // size))
    return pages


@dataclass
class HugePages:
    """What ``model_memory_on_huge_pages`` moved onto huge pages, in bytes."""

    bytes: int = 0


@contextmanager
def model_memory_on_huge_pages() -> Iterator[HugePages]:
    """Load a model inside this block; at its end the memory the block added is collapsed onto
    huge pages (see the module's text). Never raises for lack of support: it then moves nothing."""
    moved = HugePages()
    size = huge_page_size()
    before = _anonymous_pages(size) if size else set()
    yield moved
    if not size:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for page in sorted(_anonymous_pages(size) - before):
        if libc.madvise(page * size, size, MADV_COLLAPSE) == 0:
            moved.bytes += size
