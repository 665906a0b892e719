"""One program: the pre-processing, the model and the post-processing in a single Relax ``main``.

The imported model's ``main`` becomes a private function called from a new ``main`` between the
processing; inlining it leaves one dataflow block, so the backend's pipeline (legalisation, operator
fusion, scheduling) sees the processing as part of the model and fuses it with the model's first and
last operators wherever TVM's fusion rules allow.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from edgepack.errors import ProcessingError
from edgepack.frontends.types import ImportedModel
from edgepack.dims import Dims
from edgepack.processing.frames import emit_frame, frame_bytes_fit_words, frame_shape
from edgepack.processing.outputs import emit_nms, emit_output
from edgepack.processing.plan import ProcessingPlan


def processed_model(imported: ImportedModel, plan: ProcessingPlan, *, word_reads: str | None = None,
                    dims: Dims | None = None) -> ImportedModel:
    """``imported`` with ``plan``'s processing compiled around it: inputs and outputs are the plan's.

    ``word_reads``: why the backend's kernels cannot read 8-bit tensors (e.g. WGSL has no 8-bit types),
    or None; when given, frames are read as 32-bit words and their byte size must be a multiple of 4.
    ``dims``: the ranges of the frame sizes that change at run time (``size=FHxFW``), each a variable of
    ``main`` whose largest value plans the memory."""
    import tvm
    from tvm import relax, tirx

    dims = dims or {}
    if word_reads:
        for frame in plan.frames:
            if not frame_bytes_fit_words(frame, dims):
                sizes = " at every size of its --dim ranges" if frame.dynamic else ""
                raise ProcessingError(
                    f"The {frame.setting.format} frame of input {frame.name!r} ({list(frame.frame.shape)}) is not a "
                    f"whole number of 32-bit words{sizes}, which this backend needs: {word_reads}.",
                    "Choose a frame size whose byte count is a multiple of 4 (size=HxW; for a --dim range, a "
                    "width whose minimum and step are multiples of 4, e.g. --dim FW=320..1920:4).")
    sizes = {name: tirx.Var(name, "int64") for frame in plan.frames if frame.dynamic
             for name in frame.frame.shape if isinstance(name, str)}

    mod = imported.mod
    model = mod["main"]
    num_input = int(model.attrs["num_input"]) if model.attrs and "num_input" in model.attrs else len(model.params)
    base = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"}, attrs=mod.attrs)
    bb = relax.BlockBuilder(base)
    inner = bb.add_func(model.without_attr("global_symbol"), "edgepack_model")
    params, args = [], []
    frames = {f.name: f for f in plan.frames}
    for i, param in enumerate(model.params):
        name = param.name if i < num_input else None
        if name in frames:
            frame = frames[name]
            params.append(relax.Var(name, relax.TensorType(frame_shape(frame, sizes), "uint8")))
        else:
            params.append(relax.Var(param.name, param.ty))
    attrs = {k: v for k, v in (model.attrs or {}).items() if k != "global_symbol"}
    if sizes:  # what Relax's memory planning reads: each variable's largest value, and that it is not negative
        attrs["tir_var_upper_bound"] = {name: dims[name].max for name in sizes}
        attrs["tir_non_negative_var"] = list(sizes)
    with bb.function("main", params, attrs):
        with bb.dataflow():
            for i, (param, new) in enumerate(zip(model.params, params)):
                name = param.name if i < num_input else None
                args.append(emit_frame(bb, new, frames[name], word_reads=bool(word_reads), sizes=sizes)
                            if name in frames else new)
            result = bb.emit(relax.Call(inner, args))
            raw = ([bb.emit(relax.TupleGetItem(result, i)) for i in range(len(plan.model_outputs))]
                   if isinstance(result.ty, relax.TupleType) else [result])
            by_name = dict(zip((t.name for t in plan.model_outputs), raw))
            outs: list[Any] = []
            for spec, value in zip(plan.model_outputs, raw):
                nms = plan.nms
                if nms is not None and spec.name == nms.boxes.name:
                    outs += emit_nms(bb, value, by_name[nms.scores.name], nms)
                elif nms is not None and spec.name == nms.scores.name:
                    continue
                else:
                    output_plan = plan.output_plan(spec.name)
                    outs += emit_output(bb, value, output_plan) if output_plan else [value]
            gv = bb.emit_output(relax.Tuple(outs) if len(outs) > 1 else outs[0])
        bb.emit_func_output(gv)
    combined = tvm.transform.Sequential([
        relax.transform.InlinePrivateFunctions(),
        relax.transform.DeadCodeElimination(["main"]),
        relax.transform.CanonicalizeBindings(),
    ])(bb.get())
    info = dataclasses.replace(imported.info, inputs=plan.inputs, outputs=plan.results)
    return dataclasses.replace(imported, info=info, mod=combined, inputs=plan.inputs)
