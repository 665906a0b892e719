"""What a model holds (inputs, outputs, operators, what edgepack supports), optionally its Relax IR before and
after fusion; and what a GPU build's kernels are, with their launch sizes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgepack.backends import backend_for
from edgepack.backends.program_sizes import ConstantSizes
from edgepack.compiling import fusion_ir
from edgepack.dims import dims_from_dict
from edgepack.frontends import ModelInfo, import_model, inspect_model
from edgepack.manifest import read_manifest
from edgepack.processing import build_program, manifest_plan, model_dims, model_input_shapes
from edgepack.tensors import Shape, TensorSpec


@dataclass(frozen=True)
class BuildInputsOutputs:
    """What a build directory's program takes and returns (after any compiled-in processing)."""

    build_dir: Path
    profile: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    described: dict[str, str]  # processed tensor name -> what it is, in words
    settings: tuple[str, ...]  # the processing as --preprocess / --postprocess values
    dims: tuple[str, ...] = ()  # the dimensions that change at run time, as --dim values ("W=32..1280")
    library: LibrarySizes | None = None
    precision: str = "fp32"  # what its float tensors are stored and computed in (compile --precision)
    #: a GPU build's operators that run on the device's CPU ({ONNX node (variable): why}; backends/placement.py)
    cpu_operators: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"build_dir": str(self.build_dir), "profile": self.profile, "precision": self.precision,
                "cpu_operators": dict(self.cpu_operators),
                "library": self.library.to_dict() if self.library else None,
                "inputs": [t.to_dict() | ({"processing": self.described[t.name]} if t.name in self.described else {})
                           for t in self.inputs],
                "outputs": [t.to_dict() | ({"processing": self.described[t.name]} if t.name in self.described else {})
                            for t in self.outputs],
                "processing": list(self.settings), "dims": list(self.dims)}


@dataclass(frozen=True)
class LibrarySizes:
    """A build's device library against its model file, and its program as the compile measured it
    (``backends/program_sizes.py``; None in builds made before edgepack measured it)."""

    model_bytes: int
    library_bytes: int
    constants: ConstantSizes | None = None  # the program's constant tensors (weights)
    run_memory: int | None = None  # bytes a run allocates: planned intermediates and outputs, at the largest sizes

    @classmethod
    def of(cls, manifest) -> LibrarySizes:
        extra = manifest.extra or {}
        return cls(manifest.artifacts["model"].size, manifest.artifacts["device_library"].size,
                   ConstantSizes.from_dict(extra["constants"]) if extra.get("constants") else None,
                   extra.get("run_memory"))

    def to_dict(self) -> dict[str, Any]:
        return {"bytes": self.library_bytes, "model_bytes": self.model_bytes,
                "constants": self.constants.to_dict() if self.constants else None, "run_memory": self.run_memory}


@dataclass(frozen=True)
class ModelInspection:
    info: ModelInfo
    ir_before_fusion: str | None = None
    ir_after_fusion: str | None = None
    build: BuildInputsOutputs | None = None  # when a build directory was inspected: its program

    def to_dict(self) -> dict[str, Any]:
        data = self.info.to_dict()
        if self.ir_before_fusion is not None:
            data["ir_before_fusion"], data["ir_after_fusion"] = self.ir_before_fusion, self.ir_after_fusion
        if self.build is not None:
            data["build"] = self.build.to_dict()
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
    also import it and show the Relax program before and after operator fusion.

    ``model`` may be a build directory: then its source model is inspected and ``build`` says what the
    compiled program takes and returns, with any processing compiled into it."""
    if Path(model).is_dir():
        build_dir = Path(model)
        manifest = read_manifest(build_dir)
        plan = manifest_plan(manifest)
        described = {t.name: text for t in (*manifest.inputs, *manifest.outputs)
                     if plan is not None and (text := plan.describe(t.name))}
        build = BuildInputsOutputs(build_dir, manifest.profile_name, manifest.inputs, manifest.outputs, described,
                                   tuple(s.spec() for s in plan.settings) if plan else (),
                                   tuple(str(r) for r in dims_from_dict(manifest.dims).values()),
                                   LibrarySizes.of(manifest), manifest.precision,
                                   dict((manifest.extra.get(backend_for(manifest).name) or {}).get("cpu_operators") or {}))
        shapes = input_shapes or model_input_shapes(manifest)
        info = inspect_model(build_dir / manifest.model_file)
        if not ir:
            return ModelInspection(info, build=build)
        program = build_program(import_model(build_dir / manifest.model_file, shapes, model_dims(manifest)),
                                manifest,
                                backend_for(manifest).no_byte_tensors)  # the model with its processing around it
        before, after = fusion_ir(program)
        return ModelInspection(info, before, after, build)
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
