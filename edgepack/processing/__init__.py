"""Pre- and post-processing compiled into the model: camera frames in, answers out.

    settings    the dataclasses a user writes (ImagePreprocess, OutputPostprocess, NmsPostprocess)
    parse       --preprocess / --postprocess strings and TOML files into them
    plan        the settings resolved against the model's inputs and outputs (or a ProcessingError)
    frames      pre-processing as Relax (frame -> model input), outputs: post-processing as Relax,
    kernels     top-K and NMS in TensorIR, program: all of it around the model's main function
    reference   the independent reference: ONNX Runtime pre-graph -> original model -> NumPy post
    pictures    random frames and a test picture drawn here
"""

from __future__ import annotations

from edgepack.dims import Dims, dims_from_dict
from edgepack.frontends.types import ImportedModel
from edgepack.manifest import BuildManifest
from edgepack.processing.parse import PostprocessLike, PreprocessLike, parse_postprocess, parse_preprocess
from edgepack.processing.pictures import encode_frame, picture_frames, random_frames, synthetic_picture
from edgepack.processing.plan import FramePlan, NmsPlan, OutputPlan, ProcessingPlan, plan_processing
from edgepack.processing.program import processed_model
from edgepack.processing.reference import ReferenceRun, run_processed_reference
from edgepack.processing.settings import ImagePreprocess, NmsPostprocess, OutputPostprocess

__all__ = [
    "FramePlan", "ImagePreprocess", "NmsPlan", "NmsPostprocess", "OutputPlan", "OutputPostprocess",
    "PostprocessLike", "PreprocessLike", "ProcessingPlan", "ReferenceRun", "build_program", "encode_frame",
    "manifest_plan", "model_dims", "model_input_shapes", "parse_postprocess", "parse_preprocess", "picture_frames",
    "plan_processing", "processed_model", "random_frames", "run_processed_reference", "synthetic_picture",
]


def manifest_plan(manifest: BuildManifest) -> ProcessingPlan | None:
    """The processing a build was compiled with (None for a build without)."""
    return ProcessingPlan.from_dict(manifest.processing) if manifest.processing else None


def build_program(imported: ImportedModel, manifest: BuildManifest, word_reads: str | None) -> ImportedModel:
    """What a build compiles: ``imported`` (the build's model) with the build's processing around it."""
    plan = manifest_plan(manifest)
    if plan is None:
        return imported
    dims = dims_from_dict(manifest.dims)
    return processed_model(imported, plan, word_reads=word_reads,
                           dims={n: r for n, r in dims.items() if n not in model_dims(manifest)})


def model_dims(manifest: BuildManifest) -> Dims:
    """The ``--dim`` ranges of the build's model itself (what ``import_model`` needs to compile it again), not
    those of frames whose size changes (``size=FHxFW``)."""
    dims = dims_from_dict(manifest.dims)
    used = {d for t in model_input_shapes(manifest).values() for d in t if isinstance(d, str)}
    return {n: r for n, r in dims.items() if n in used}


def model_input_shapes(manifest: BuildManifest) -> dict[str, tuple[int, ...]]:
    """The input shapes of the build's model itself (what ``import_model`` needs to compile it again)."""
    plan = manifest_plan(manifest)
    specs = plan.model_inputs if plan else manifest.inputs
    return {t.name: tuple(d if isinstance(d, str) else int(d) for d in t.shape) for t in specs}  # str: a --dim
