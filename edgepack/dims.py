"""Input dimensions that change at run time: ``--dim W=32..1280`` (``:32`` for a step), their parsing, the sizes
a dynamic build is checked at, and the input shapes at one size.

A build with dims runs at any size in range: its input shapes name the dims (``x: 1,3,48,W``), its program
takes every value ``min + k * step`` up to ``max`` (memory planned for ``max``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from edgepack.errors import ShapeError
from edgepack.tensors import TensorSpec

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RANGE = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)\s*\.\.\s*(\d+)\s*(?::\s*(\d+))?\s*\Z")


@dataclass(frozen=True)
class DimRange:
    """A named input dimension: any of ``min, min + step, ...`` up to ``max``."""

    name: str
    min: int
    max: int
    step: int = 1

    def __str__(self) -> str:
        return f"{self.name}={self.min}..{self.max}" + (f":{self.step}" if self.step != 1 else "")

    def takes(self, value: int) -> bool:
        return self.min <= value <= self.max and (value - self.min) % self.step == 0

    def check(self, value: int) -> None:
        if not self.takes(value):
            raise ShapeError(
                f"Size {self.name}={value} is outside the build's range {self}"
                + (f" (values {self.min}, {self.min + self.step}, ... {self.max})" if self.step != 1 else "") + ".",
                f"Use a size in that range, or compile again with a --dim that covers {value}.",
            )

    def to_dict(self) -> dict[str, int]:
        return {"min": self.min, "max": self.max, "step": self.step}

    @property
    def inner_name(self) -> str:
        """The program's variable of a dim with a step: ``n`` in ``W = step * n + min % step``, named ``W_32``."""
        return f"{self.name}_{self.step}" if self.step > 1 else self.name

    def variables(self, value: int) -> dict[str, int]:
        """The values the program's symbolic variables of this dim take at size ``value``."""
        found = {self.name: value}
        if self.step > 1:
            found[self.inner_name] = (value - self.min % self.step) // self.step
        return found


Dims = dict[str, DimRange]


def is_dim_name(text: str) -> bool:
    return bool(_NAME.match(text))


def parse_dims(specs: list[str] | None) -> Dims:
    """``["W=32..1280", "H=320..640:32"]`` (the CLI's ``--dim``) as ranges by name."""
    dims: Dims = {}
    for spec in specs or []:
        match = _RANGE.match(spec)
        if not match:
            raise ShapeError(f"Cannot read --dim {spec!r}.",
                             "Write it as NAME=MIN..MAX or NAME=MIN..MAX:STEP, e.g. --dim W=32..1280:8.")
        name, lo, hi, step = match.group(1), int(match.group(2)), int(match.group(3)), int(match.group(4) or 1)
        if lo < 1 or hi < lo or step < 1:
            raise ShapeError(f"--dim {spec!r} is not a range of sizes: it needs 1 <= MIN <= MAX and STEP >= 1.",
                             f"E.g. --dim {name}={max(min(lo, hi), 1)}..{max(lo, hi, 1)}.")
        if (hi - lo) % step:
            raise ShapeError(
                f"--dim {spec!r} is not a range of sizes: its STEP does not go from MIN to MAX ({hi} - {lo} is not"
                f" a multiple of {step}).",
                f"End it on the step, e.g. --dim {name}={lo}..{hi - (hi - lo) % step}:{step}.")
        if name in dims:
            raise ShapeError(f"--dim {name} is given twice.", "Give each dimension one range.")
        dims[name] = DimRange(name, lo, hi, step)
    return dims


def dims_from_dict(data: dict[str, Any] | None) -> Dims:
    return {name: DimRange(name, int(v["min"]), int(v["max"]), int(v.get("step", 1))) for name, v in (data or {}).items()}


def dims_used(specs: tuple[TensorSpec, ...]) -> list[str]:
    """The dim names the input shapes use, in order of first use."""
    return list(dict.fromkeys(d for s in specs for d in s.shape if isinstance(d, str)))


def check_sizes(dims: Dims) -> list[dict[str, int]]:
    """The sizes a dynamic build is checked at: every dim at its smallest, at its largest, and three between
    (odd values where the step allows them: sizes no kernel tile divides)."""
    if not dims:
        return [{}]
    points = {name: _points(r) for name, r in dims.items()}
    count = max(len(p) for p in points.values())
    return [{name: p[min(i, len(p) - 1)] for name, p in points.items()} for i in range(count)]


def _points(r: DimRange) -> list[int]:
    values = [r.min, r.max]
    for fraction in (0.37, 0.11, 0.71):
        k = round((r.max - r.min) * fraction / r.step)
        value = r.min + k * r.step
        if value % 2 == 0 and r.step % 2 == 1 and r.takes(value + r.step):
            value += r.step  # an odd size where the step makes one
        values.append(value)
    return list(dict.fromkeys(v for v in values if r.takes(v)))


def parse_size_values(specs: list[str] | None, option: str = "--tune-size") -> dict[str, int]:
    """``["W=192"]`` as ``{"W": 192}`` (no range to check them against)."""
    sizes: dict[str, int] = {}
    for spec in specs or []:
        name, sep, value = spec.partition("=")
        if not sep or not is_dim_name(name.strip()) or not value.strip().isdigit() or int(value) <= 0:
            raise ShapeError(f"Cannot read {option} {spec!r}.", f"Write it as NAME=SIZE, e.g. {option} W=320.")
        sizes[name.strip()] = int(value)
    return sizes


def substitute_sizes(shapes: dict[str, tuple], sizes: dict[str, int], option: str = "--tune-size") -> dict[str, tuple]:
    """``shapes`` (``--input-shape`` with dim names) with each name replaced by its size in ``sizes``; a
    ShapeError naming a dim with no size."""
    missing = sorted({d for shape in shapes.values() for d in shape if isinstance(d, str) and d not in sizes})
    if missing:
        raise ShapeError(f"The input shapes name {', '.join(missing)}, which {option} gives no size.",
                         f"Add {option} {missing[0]}=SIZE (e.g. {option} {missing[0]}=320).")
    return {name: tuple(sizes[d] if isinstance(d, str) else d for d in shape) for name, shape in shapes.items()}


def parse_sizes(specs: list[str] | None, dims: Dims) -> dict[str, int] | None:
    """``["W=417"]`` (``validate --size``) checked against the build's dims; None when none is given."""
    if not specs:
        return None
    sizes: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        name = name.strip()
        if not sep or not value.strip().isdigit():
            raise ShapeError(f"Cannot read --size {spec!r}.", "Write it as NAME=VALUE, e.g. --size W=417.")
        if name not in dims:
            raise ShapeError(
                f"--size names {name}, which is not a dimension of this build"
                + (f" (its dimensions: {', '.join(map(str, dims.values()))})." if dims else " (it has fixed shapes)."),
                "Name one of the build's dimensions" if dims else "Leave out --size for a build with fixed shapes.")
        dims[name].check(int(value))
        sizes[name] = int(value)
    missing = [str(dims[n]) for n in dims if n not in sizes]
    if missing:
        raise ShapeError(f"--size gives no value for {', '.join(missing)}.", "Give every dimension of the build a size.")
    return sizes


def at_size(specs: tuple[TensorSpec, ...], sizes: dict[str, int]) -> tuple[TensorSpec, ...]:
    """The input specs with each named dim replaced by its size."""
    return tuple(TensorSpec(s.name, s.dtype, tuple(sizes[d] if isinstance(d, str) else d for d in s.shape))
                 for s in specs)



def sizes_of(arrays: dict[str, Any], specs: tuple[TensorSpec, ...], dims: Dims) -> dict[str, int]:
    """The size of each dim in ``arrays`` (by input name), checked against its range and between inputs."""
    sizes: dict[str, int] = {}
    for spec in specs:
        shape = getattr(arrays.get(spec.name), "shape", None)
        if shape is None or len(shape) != len(spec.shape):
            continue  # check_inputs names what is missing or of another rank
        for want, got in zip(spec.shape, shape):
            if not isinstance(want, str):
                continue
            if want in sizes and sizes[want] != got:
                raise ShapeError(f"The inputs disagree on dimension {want}: {sizes[want]} in one, {got} in"
                                 f" {spec.name!r}.", f"Give every input the same {want}.")
            dims[want].check(int(got))
            sizes[want] = int(got)
    return sizes


def largest(specs: tuple[TensorSpec, ...], dims: Dims) -> tuple[TensorSpec, ...]:
    """The input specs at each dim's largest size (what ``bench`` times a dynamic build at: its planned worst
    case)."""
    return at_size(specs, {name: r.max for name, r in dims.items()}) if dims else specs
