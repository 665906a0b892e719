"""What a model holds (inputs, outputs, operators, what edgepack supports), optionally its Relax IR before and
after fusion; and what a GPU build's kernels are, with their launch sizes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack.backends import backend_for
from edgepack.compiling import fusion_ir
from edgepack.frontends import ModelInfo, import_model, inspect_model
from edgepack.manifest import read_manifest
from edgepack.tensors import Shape


@dataclass(frozen=True)
class ModelInspection:
    info: ModelInfo
    ir_before_fusion: str | None = None
    ir_after_fusion: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = self.info.to_dict()
        if self.ir_before_fusion is not None:
            data["ir_before_fusion"], data["ir_after_fusion"] = self.ir_before_fusion, self.ir_after_fusion
        return data


@dataclass(frozen=True)
class KernelListing:
    backend: str  # its label: "OpenCL", "Vulkan (WGSL on wgpu-native)"
    kernels: list[Any]  # backends.gpu.Kernel
    text: str  # one line per kernel, then its source

    def to_dict(self) -> list[dict[str, Any]]:
        return [k.to_dict() for k in self.kernels]


def inspect(model: Path | str, *, ir: bool = False, input_shapes: dict[str, Shape] | None = None) -> ModelInspection:
    """Read ``model`` without compiling it (never fails on unsupported operators: it lists them); with ``ir``
    also import it and show the Relax program before and after operator fusion."""
    info = inspect_model(model)
    if not ir:
        return ModelInspection(info)
    before, after = fusion_ir(import_model(model, input_shapes))
    return ModelInspection(info, before, after)


def kernels(build_dir: Path | str, *, with_source: bool = True) -> KernelListing:
    """The device kernels of a GPU build (OpenCL kernels, WGSL shaders) with their launch sizes."""
    build_dir = Path(build_dir)
    manifest = read_manifest(build_dir)
    backend = backend_for(manifest)
    found = backend.kernels(build_dir, manifest)
    return KernelListing(backend.label, found, backend.render_kernels(found, with_source=with_source))
