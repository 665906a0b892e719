"""What a CPU target offers the schedule rules: SIMD width and how many vector registers hold accumulators.

Read from the target's LLVM features, never from this machine (a build for a Raspberry Pi is made on an
x86 host). ``tvm.target.codegen.llvm_get_vector_width`` reports this machine's width for every x86 target,
including a plain ``llvm`` target whose code LLVM limits to SSE2, so the width comes from the features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CpuInfo:
    arch: str  # "x86_64", "aarch64", "arm"
    vector_bits: int  # 128 (SSE, NEON), 256 (AVX2), 512 (AVX-512)
    vector_registers: int  # architectural SIMD registers: 16 or 32
    #: 8-bit dot-product instruction: "vnni" (AVX-512 VNNI), "avxvnni" (its 256-bit VEX form), "sdot" (aarch64
    #: +dotprod), "smmla" (aarch64 +i8mm: 8-bit matrix multiply); widening sequences
    #: (``schedules/dot_product.py``): "pmaddwd" (AVX2), "smull" (aarch64
    #: without the dot product), "vmull" (armv7 NEON); None
    dot_product: str | None = None

    @classmethod
    def of(cls, target: Any) -> CpuInfo:
        from tvm.target import codegen

        features = {str(f) for f in codegen.llvm_get_cpu_features(target)}
        triple = str(target.attrs.get("mtriple", "") or codegen.llvm_get_system_triple())
        if triple.startswith(("aarch64", "arm64")):
            dot = "smmla" if "i8mm" in features else "sdot" if "dotprod" in features else "smull"
            return cls("aarch64", 128, 32, dot)
        if triple.startswith(("arm", "thumb")):
            neon = "neon" in features
            return cls("arm", 128 if neon else 32, 16, "vmull" if neon else None)
        bits = 512 if "avx512f" in features else 256 if "avx" in features else 128
        if bits == 512 and "avx512vnni" in features:
            dot = "vnni"
        else:
            dot = "avxvnni" if "avxvnni" in features else "pmaddwd" if "avx2" in features else None
        return cls("x86_64", bits, 32 if bits == 512 else 16, dot)

    def lanes(self, dtype_bits: int) -> int:
        """Elements of ``dtype_bits`` in one vector register."""
        return max(1, self.vector_bits // max(1, dtype_bits))

    @property
    def accumulators(self) -> int:
        """Vector registers a register tile may keep as accumulators: the rest hold its operands."""
        return self.vector_registers - max(4, self.vector_registers // 4)
