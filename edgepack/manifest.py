"""``manifest.json``: what a build directory holds and how it was made."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgepack.errors import EdgepackError
from edgepack.files import file_sha256
from edgepack.tensors import TensorSpec

MANIFEST_NAME = "manifest.json"
# where a build directory keeps what (see edgepack.compiling)
DEVICE_LIBRARY = "device/model.so"
DEVICE_META = "device/model.meta"
HOST_LIBRARY = "host/model.so"
BUILD_TUNING = "tuning"  # the best records a tuned build was made with (later rebuilds reuse them)
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Artifact:
    path: str  # relative to the build directory
    size: int
    sha256: str

    @classmethod
    def of(cls, root: Path, relative: str) -> Artifact:
        full = root / relative
        return cls(relative, full.stat().st_size, file_sha256(full))


@dataclass(frozen=True)
class BuildManifest:
    model_file: str  # the copy of the source model inside the build directory
    model_format: str
    model_sha256: str
    model_source: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    profile: dict[str, Any]
    target: dict[str, Any]
    host_target: dict[str, Any]
    tvm_version: str
    tvm_ffi_version: str
    edgepack_version: str
    toolchain: dict[str, str]
    artifacts: dict[str, Artifact]
    compile_seconds: float
    tuning: str | None = None
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    # pre-/post-processing compiled into the model (edgepack.processing.ProcessingPlan.to_dict); the
    # inputs and outputs above are then the processed program's, the model's own are recorded here
    processing: dict[str, Any] | None = None
    # the input dimensions that change at run time: {name: {"min", "max", "step"}} (edgepack.dims); the
    # inputs' shapes name them, and outputs' extents that follow them are "?"
    dims: dict[str, Any] | None = None
    # what its float tensors are stored and computed in (compile --precision): "fp32" or "fp16"; inputs and
    # outputs are float32 either way
    precision: str = "fp32"

    @property
    def profile_name(self) -> str:
        return self.profile["name"]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["inputs"] = [t.to_dict() for t in self.inputs]
        data["outputs"] = [t.to_dict() for t in self.outputs]
        return data

    def write(self, build_dir: Path) -> None:
        (Path(build_dir) / MANIFEST_NAME).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BuildManifest:
        data = dict(data)
        data["inputs"] = tuple(TensorSpec.from_dict(t) for t in data["inputs"])
        data["outputs"] = tuple(TensorSpec.from_dict(t) for t in data["outputs"])
        data["artifacts"] = {k: Artifact(**v) for k, v in data["artifacts"].items()}
        return cls(**data)


def read_manifest(build_dir: Path) -> BuildManifest:
    """Read a build directory's manifest, or explain why the directory is not a build."""
    build_dir = Path(build_dir)
    path = build_dir / MANIFEST_NAME
    if not path.is_file():
        raise EdgepackError(
            f"{build_dir} is not an edgepack build directory (no {MANIFEST_NAME}).",
            "Create one with `edgepack compile MODEL --profile PROFILE -o DIR`.",
        )
    try:
        data = json.loads(path.read_text())
        if data.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"format_version {data.get('format_version')}, expected {FORMAT_VERSION}")
        return BuildManifest.from_dict(data)
    except (ValueError, KeyError, TypeError) as exc:
        raise EdgepackError(
            f"{path} is unreadable or from an incompatible edgepack ({exc}).",
            "Compile the model again with this edgepack version (--force to replace the directory).",
        ) from exc
