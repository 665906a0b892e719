"""``include/edgepack_model.h`` of a C bundle: the model's inputs and outputs for the C programmer, in
comments and ``#define``s (indices, frame sizes), including what compiled-in processing does."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from edgepack.dims import dims_from_dict
from edgepack.manifest import BuildManifest
from edgepack.processing import manifest_plan
from edgepack.tensors import TensorSpec
from edgepack.versions import __version__

HEADER = "edgepack_model.h"


def _macro(name: str) -> str:
    words = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper() or "T"
    return words if not words[0].isdigit() else "T" + words


def _comment(text: str) -> str:
    return text.replace("*/", "* /")


def model_header(manifest: BuildManifest) -> str:
    """The text of ``include/edgepack_model.h`` for the build ``manifest``."""
    plan = manifest_plan(manifest)
    model = Path(manifest.model_source).name
    lines = [f"/* {HEADER}: the model of this bundle, {_comment(model)} compiled for {manifest.profile_name} by",
             f" * edgepack {__version__}. Generated: run `edgepack package c` again rather than editing it.",
             " *",
             " * Use it with edgepack.h: tensors are passed by index (ep_model_set_input, ep_model_get_output) in",
             " * the order below, each a C-contiguous array of the dtype and shape given.",
             " *"]

    def tensors(kind: str, specs: tuple[TensorSpec, ...]) -> None:
        lines.append(f" * {kind}:")
        for i, spec in enumerate(specs):
            lines.append(f" *   {i}  {_comment(spec.name)}  {spec.dtype} [{', '.join(str(d) for d in spec.shape)}]")
            text = plan.describe(spec.name) if plan else None
            if text:
                lines.extend(f" *      {_comment(part)}" for part in textwrap.wrap(text, 92))

    tensors("Inputs", manifest.inputs)
    tensors("Outputs", manifest.outputs)
    dims = dims_from_dict(manifest.dims)
    if dims:
        lines.append(" *")
        lines.append(" * Dimensions that change at run time (set each run with ep_model_set_input_typed; an output's '?'")
        lines.append(" * extents are its shape after the run, ep_model_output_shape):")
        lines.extend(f" *   {r.name} from {r.min} to {r.max}" + (f" in steps of {r.step}" if r.step != 1 else "")
                     for r in dims.values())
    if plan is not None:
        lines.append(" *")
        lines.append(" * Compiled in with `edgepack compile` (docs/processing.md):")
        for setting in plan.settings:
            option = "--preprocess" if setting in [f.setting for f in plan.frames] else "--postprocess"
            lines.append(f" *   {option} {_comment(setting.spec())}")
        lines.append(" * The program takes the uint8 frames as they are (row by row, channels interleaved) and")
        lines.append(" * returns the answers: no conversion, resizing or normalisation is left to the caller.")
    lines.append(" */")
    lines += ["#ifndef EDGEPACK_MODEL_H", "#define EDGEPACK_MODEL_H", "",
              f"#define EDGEPACK_MODEL_NUM_INPUTS {len(manifest.inputs)}",
              f"#define EDGEPACK_MODEL_NUM_OUTPUTS {len(manifest.outputs)}", ""]
    for kind, specs in (("INPUT", manifest.inputs), ("OUTPUT", manifest.outputs)):
        for i, spec in enumerate(specs):
            lines.append(f"#define EDGEPACK_MODEL_{kind}_{_macro(spec.name)} {i} /* index of {kind.lower()} "
                         f"\"{_comment(spec.name)}\" */")
    for r in dims.values():
        lines += ["", f"/* dimension {r.name} of the inputs: any of {r.min}, {r.min} + {r.step}, ... {r.max} */",
                  f"#define EDGEPACK_MODEL_DIM_{_macro(r.name)}_MIN {r.min}",
                  f"#define EDGEPACK_MODEL_DIM_{_macro(r.name)}_MAX {r.max}",
                  f"#define EDGEPACK_MODEL_DIM_{_macro(r.name)}_STEP {r.step}"]
    if plan is not None:
        for frame in plan.frames:
            prefix = f"EDGEPACK_MODEL_{_macro(frame.name)}_FRAME"
            lines += ["", f"/* the camera frames input \"{_comment(frame.name)}\" takes ({frame.setting.format}) */"]
            if frame.dynamic:  # its size: the dims' ranges above
                largest = frame.sized({r.name: r.max for r in dims.values()})
                lines += [f"#define {prefix}_CHANNELS {frame.frame.shape[-1]}",
                          f"#define {prefix}_BYTES_MAX {_bytes(largest.frame)} /* at the largest height and width */"]
            else:
                lines += [f"#define {prefix}_HEIGHT {frame.frame_height}",
                          f"#define {prefix}_WIDTH {frame.frame_width}",
                          f"#define {prefix}_BYTES {_bytes(frame.frame)}"]
    lines += ["", "#endif /* EDGEPACK_MODEL_H */", ""]
    return "\n".join(lines)


def _bytes(spec: TensorSpec) -> int:
    n = 1
    for d in spec.shape:
        n *= int(d)
    return n
