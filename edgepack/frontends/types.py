"""What a model file holds (read without compiling it), and a model imported into TVM's Relax IR."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgepack.dims import Dims
from edgepack.tensors import ModelFormat, TensorSpec

#: the attribute of a kernel an importer wrote whose work is one serial loop (an LSTM's steps over a
#: run-time length, ``recurrent_loop.py``): GPU builds run it on the device's CPU instead of one GPU thread
SERIAL_KERNEL_ATTR = "edgepack.serial"


def is_serial_kernel(func) -> bool:
    """Whether a PrimFunc carries ``SERIAL_KERNEL_ATTR``."""
    return func.attrs is not None and bool(func.attrs.get(SERIAL_KERNEL_ATTR))


@dataclass(frozen=True)
class ModelInfo:
    """What a model file contains, as read without compiling it."""

    path: Path
    format: ModelFormat
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    operator_counts: dict[str, int]
    unsupported_operators: dict[str, int] = field(default_factory=dict)
    opset: int | None = None
    # outputs that are quantized: their quantization step, in the output's own units (an 8-bit integer
    # output: 1; a float output made by DequantizeLinear: its scale); validation allows one step there
    output_steps: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "format": self.format,
            "sha256": self.sha256,
            "opset": self.opset,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "operator_counts": self.operator_counts,
            "unsupported_operators": self.unsupported_operators,
            # per operator: whether edgepack (TVM's frontend + edgepack's converters) can compile it
            "operators": [{"name": op, "count": n, "supported": op not in self.unsupported_operators}
                          for op, n in self.operator_counts.items()],
            "support": self.support_summary(),
        }

    def support_summary(self) -> dict[str, int]:
        nodes = sum(self.operator_counts.values())
        bad_nodes = sum(self.unsupported_operators.values())
        return {"operators": len(self.operator_counts),
                "supported_operators": len(self.operator_counts) - len(self.unsupported_operators),
                "unsupported_operators": len(self.unsupported_operators),
                "nodes": nodes, "supported_nodes": nodes - bad_nodes, "unsupported_nodes": bad_nodes}


@dataclass(frozen=True)
class ImportedModel:
    info: ModelInfo
    mod: Any  # tvm.IRModule
    inputs: tuple[TensorSpec, ...]  # in the order of the Relax main function; a str dimension names one of dims
    dims: Dims = field(default_factory=dict)  # the ranges of the dimensions that change at run time




def format_shape(shape) -> str:
    """``(1, 'n', 3)`` -> ``[1, n, 3]`` for messages."""
    return "[" + ", ".join(str(d) for d in shape) + "]"
