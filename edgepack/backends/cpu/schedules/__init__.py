"""edgepack's default CPU schedules: what an untuned CPU build runs, for every CPU profile.

TVM's Relax pipeline schedules nothing for CPUs (every kernel a scalar, single-threaded loop nest) and
its dlight rules are for GPUs. These rules give each fused kernel a parallel, vectorized, register-tiled
loop nest from its shapes and the target's SIMD width and register count (``machine.CpuInfo``): the
same code for a model no one here has seen. They are tried in order; a kernel none takes keeps TVM's
loop nest and is named in the build's schedule report (``edgepack compile`` prints it).
"""

from __future__ import annotations

from edgepack.backends.cpu.schedules.conv import Conv2D
from edgepack.backends.cpu.schedules.dot_product import DotProductConv
from edgepack.backends.cpu.schedules.fused import DepthwisePointwise
from edgepack.backends.cpu.schedules.injective import Injective
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.schedules.matmul import Matmul
from edgepack.backends.cpu.schedules.pool import Pool
from edgepack.backends.cpu.schedules.reduction import Reduction
from edgepack.backends.cpu.schedules.rule import CpuRule
from edgepack.backends.cpu.schedules.winograd import WinogradInput, WinogradOutput


def default_rules() -> list[CpuRule]:
    """The rules in the order they are tried."""
    return [DotProductConv(), Conv2D(), DepthwisePointwise(), Matmul(), Pool(), Reduction(), WinogradInput(), WinogradOutput(), Injective()]


__all__ = [
    "Conv2D",
    "CpuInfo",
    "CpuRule",
    "DepthwisePointwise",
    "DotProductConv",
    "Injective",
    "Matmul",
    "Pool",
    "Reduction",
    "WinogradInput",
    "WinogradOutput",
    "default_rules",
]
