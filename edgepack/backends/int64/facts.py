"""What the 32-bit tensor replacing an int64 tensor holds: an interval, exact or saturated (``Fact``),
and the interval arithmetic the proof step builds on."""

from __future__ import annotations

import math
from dataclasses import dataclass

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
#: Saturated 32-bit values are clamped to +-SAT_BOUND: representable exactly in float32 too, and away
#: from INT32_MIN, which WGSL cannot write as a literal (``-2147483648i`` does not parse).
SAT_BOUND = 2**31 - 128

@dataclass(frozen=True)
class Fact:
    """What the 32-bit tensor that replaces an int64 tensor holds.

    ``lo``/``hi`` bound its values (within int32). ``agree`` is None when it equals the int64 tensor
    (an *exact* narrowing); else ``(a, b)``: equal wherever the int64 value lies in [a, b], and
    >= b (<= a) wherever the int64 value is > b (< a) (a *saturated* narrowing)."""

    lo: int
    hi: int
    agree: tuple[int, int] | None = None

    @property
    def exact(self) -> bool:
        return self.agree is None

    @property
    def agreement(self) -> tuple[float, float]:
        return (-math.inf, math.inf) if self.agree is None else self.agree

    def covers(self, lo: float, hi: float, strict: bool = False) -> bool:
        """Whether the 32-bit values equal the int64 values on [lo, hi] (strictly inside the
        agreement interval with ``strict``)."""
        a, b = self.agreement
        return (a < lo and hi < b) if strict else (a <= lo and hi <= b)


def fits(lo, hi) -> bool:
    return INT32_MIN <= lo and hi <= INT32_MAX


def exact(lo, hi) -> Fact | str:
    lo, hi = int(lo), int(hi)
    if not fits(lo, hi):
        return f"its values may reach [{lo}, {hi}], beyond 32 bits"
    return Fact(lo, hi)


def join(facts: list[Fact]) -> Fact:
    lo = min(f.lo for f in facts)
    hi = max(f.hi for f in facts)
    agreements = [f.agree for f in facts if f.agree is not None]
    if not agreements:
        return Fact(lo, hi)
    return Fact(lo, hi, (max(a for a, _ in agreements), min(b for _, b in agreements)))


SATURATED = Fact(-SAT_BOUND, SAT_BOUND, (-SAT_BOUND, SAT_BOUND))
DTYPE_RANGE = {"bool": (0, 1), "int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
               "uint16": (0, 65535), "int32": (INT32_MIN, INT32_MAX)}
FLOATS = ("float16", "float32", "float64", "bfloat16")
