"""The Relax pipeline of CPU builds: TVM's CPU passes with edgepack's default schedules and, for tuned
builds, MetaSchedule's records applied first.

    dispatch, legalize, fuse         convolutions channels-last (NHWC, ``channels_last.py``), 3x3 ones
                                     as Winograd kernels (``winograd.py``), output channels and a
                                     constant matrix's columns padded to whole vectors (``channels.py``),
                                     softmax with a vectorizable exp (``softmax.py``), depthwise
                                     convolutions and per-channel scalings fused into the 1x1
                                     convolution after them (``fuse_depthwise.py``, ``fuse_scale.py``),
                                     weights that are float16 values kept float16 (``half_weights.py``),
                                     weights marked layout-free
    [tuning records]                 the best record of each kernel that has one ("tuned")
    default schedules                edgepack's rules for every other kernel (``schedules/``)
    weight layouts folded            each kernel's weight rewrite runs once, here, on the constants
    lower, finalize                  TVM's CPU passes
"""

from __future__ import annotations

import contextlib
from typing import Any

from edgepack.backends.base import KernelForm, TuningRecords
from edgepack.backends.cpu.channels import pad_matmul_columns, pad_output_channels
from edgepack.backends.cpu.channels_last import channels_last
from edgepack.backends.cpu.conv_transpose import conv_transpose_as_convolution
from edgepack.backends.cpu.dot_product import dot_product_convolutions, dot_product_matmuls
from edgepack.backends.cpu.fuse_depthwise import fuse_depthwise_pointwise
from edgepack.backends.cpu.fuse_scale import fuse_channel_scale
from edgepack.backends.cpu.half_weights import half_weights, widens_in_hardware
from edgepack.backends.cpu.integer_depthwise import depthwise_of_8_bit_inputs
from edgepack.backends.cpu.schedules import default_rules
from edgepack.backends.cpu.schedules.machine import CpuInfo
from edgepack.backends.cpu.softmax import vector_softmax
from edgepack.backends.cpu.vector_math import vector_sigmoid_tanh
from edgepack.backends.cpu.winograd import winograd_convolutions
from edgepack.backends.folding import fold_constant_calls
from edgepack.backends.integer import elementwise_quantization, integer_products
from edgepack.backends.program_sizes import measuring
from edgepack.backends.scheduling import note_tuned_pass, recording_schedule_pass, rule_name
from edgepack.backends.sized_records import records_at_size


def _cpu_passes():
    # the module, not the package: tvm.relax.backend.cpu_generic does not export dataflow_lower_passes
    from tvm.relax.backend.cpu_generic import pipeline

    return pipeline


#: How untuned builds, and new tuning directories, form their kernels.
UNTUNED_FORM = KernelForm(weight_prepack=True, channels_last=True, winograd=4, winograd_reuse=16,
                          winograd_budget=0.25, padded_channels=True, fused_depthwise=True, fused_scale=True,
                          half_weights=True)


def prepare_passes(target, form: KernelForm) -> list:
    """Relax passes up to fused TIR kernels: the same for task extraction, records and default schedules.

    ``form.weight_prepack``: the weights are constants, so the CPU kernels mark them layout-free; a schedule
    (a rule's or a tuning record's, ``RewriteLayout``) may then pick the weight layout that suits its
    loop nest, and the rewrite is done once at compile time (``weight_prepack_passes``), not on every
    inference. ``form.channels_last``: convolutions (and the elementwise and pooling operators between them)
    work on NHWC activations, the model's NCHW input and output transposed once at its ends. Channels
    are the axis SIMD lanes fill best: a depthwise or strided convolution in NCHW vectorizes along a row
    of 7-112 pixels (strided loads for stride 2), in NHWC along 16-1280 contiguous channels
    (MobileNetV2's stride-2 depthwise convolution on 112x112: 0.28 ms after 64 trials in NHWC,
    0.40 ms in NCHW). ``form.winograd`` (channels-last only): 3x3 convolutions of stride 1 with enough
    channels become Winograd kernels (``winograd.py``) with output tiles of up to that size: F(2x2, 3x3)
    2.25x fewer multiplies, F(4x4, 3x3) 4x (``form.winograd_reuse``: only where each of its transformed
    weights serves that many tiles). ``form.padded_channels`` (channels-last only): convolutions
    whose output channels the SIMD width does not divide compute a few more and crop them (``channels.py``).
    ``form.fused_depthwise`` (channels-last only): a depthwise convolution and the 1x1 convolution that
    reads it are one kernel (``fuse_depthwise.py``). ``form.fused_scale`` (channels-last only): a tensor
    scaled per channel (a squeeze-and-excitation gate) and the 1x1 convolution that reads it are one
    kernel (``fuse_scale.py``).
    """
    from tvm import relax

    cpu = _cpu_passes()
    prepack = [relax.transform.AttachAttrLayoutFreeBuffers()] if form.weight_prepack else []
    rewrites = [integer_products(), elementwise_quantization(), conv_transpose_as_convolution(), vector_softmax()]
    cpu_info = CpuInfo.of(target)
    layout = [channels_last(), dot_product_convolutions(cpu_info), dot_product_matmuls(cpu_info),
              depthwise_of_8_bit_inputs()] if form.channels_last else []
    if form.channels_last and form.winograd:
        layout.append(winograd_convolutions(form.winograd, form.winograd_reuse, form.winograd_budget))
    if form.channels_last and form.padded_channels:
        lanes = CpuInfo.of(target).lanes(32)
        layout += [pad_output_channels(lanes), pad_matmul_columns(lanes)]
    if form.half_weights and widens_in_hardware(target):
        layout += half_weights()
    # TVM's FoldConstant compiles each kernel on constants apart; fold_constant_calls, all at once
    legalize = []
    for p in cpu.legalize_passes(target):
        if p.info.name == "FuseTIR" and form.channels_last and form.fused_depthwise:
            legalize.append(fuse_depthwise_pointwise(CpuInfo.of(target)))
        if p.info.name == "FuseTIR" and form.channels_last and form.fused_scale:
            legalize.append(fuse_channel_scale())
        legalize.append(fold_constant_calls() if p.info.name == "FoldConstant" else p)
    # after the layout passes: channels_last moves relax.sigmoid into NHWC, not the kernel it becomes
    return [*rewrites, *layout, vector_sigmoid_tanh(), *cpu.library_dispatch_passes(target), *legalize, *prepack]


def weight_prepack_passes() -> list:
    """After scheduling: split each kernel's weight-layout rewrite into its own function and fold it
    into the constant weights (so it never runs on the device). Then the bindings that passed the
    weights on are dead (a tuple of the rewritten weights, the items taken from it): each was a VM
    instruction per inference (MobileNetV2: 186 of its 322; without them BlazeFace ran 1-2% faster,
    PP-OCR cls up to 4%, MobileNetV2 0.3-1.7%, at 1 and 2 threads)."""
    from tvm import relax

    return [_split_layout_rewrites(), fold_constant_calls(), relax.transform.CanonicalizeBindings(),
            relax.transform.DeadCodeElimination()]


def _split_layout_rewrites():
    """TVM's ``SplitLayoutRewritePreproc`` on the kernels that rewrite a weight layout. The pass fails
    on kernels written without blocks (TOPI's sort and top-k), which it has nothing to do with, so
    those are set aside while it runs."""
    import tvm
    import tvm_ffi
    from tvm import relax, s_tir, tirx

    split = relax.transform.SplitLayoutRewritePreproc()

    def rewrites_a_layout(func) -> bool:
        found = []
        tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, lambda b: found.append(
            "meta_schedule.layout_rewrite_preproc" in b.annotations))], order="pre")
        return any(found)

    @tvm.transform.module_pass(opt_level=0, name="EdgepackSplitLayoutRewrites")
    def _pass(mod, _ctx):
        aside = {gvar: func for gvar, func in mod.functions_items()
                 if isinstance(func, tirx.PrimFunc) and not rewrites_a_layout(func)}
        if len(aside) == len([f for _g, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]):
            return mod
        kept = tvm.IRModule({g: f for g, f in mod.functions_items() if g not in aside}, attrs=mod.attrs)
        result = split(kept)
        for gvar, func in aside.items():
            result[gvar] = func
        return result

    return _pass


def cpu_pipeline(target, record: dict[str, str], records: TuningRecords | None = None,
                 recomputed: dict[str, float] | None = None, measured: dict | None = None):
    """The pipeline (a module pass) and the names of what can schedule a kernel in it.

    ``record`` receives, per fused function, the rule that scheduled it, "tuned", or "none"; ``measured``
    the program's constants and run memory (``program_sizes.measuring``). Untuned
    builds form their kernels as ``UNTUNED_FORM``; a tuned build as its records were tuned (older tuning
    directories: NCHW, the model's weight layout, direct 3x3 convolutions)."""
    import tvm
    from tvm import relax

    form = records.form if records is not None else UNTUNED_FORM
    cpu = _cpu_passes()
    rules = default_rules()

    @tvm.transform.module_pass(opt_level=0, name="EdgepackCpuPipeline")
    def _pipeline(mod, _ctx):
        with target, (records.database if records is not None else contextlib.nullcontext()):
            tuned = []
            if records is not None:  # ApplyDatabase reads the target when it is made
                note_before, note_after = note_tuned_pass(record)
                tuned = [note_before, relax.transform.MetaScheduleApplyDatabase(enable_warning=False), note_after]
                if records.sizes:  # records tuned at one size, on the kernels of a dynamic build
                    tuned.append(records_at_size(records.database, records.sizes, record))
            seq = tvm.transform.Sequential(measuring([
                *prepare_passes(target, form),
                *tuned,
                recording_schedule_pass(rules, record, recomputed=recomputed),
                *(weight_prepack_passes() if form.weight_prepack else []),
                *cpu.dataflow_lower_passes(target),
                *cpu.finalize_passes(target),
            ], measured if measured is not None else {}))
            return seq(mod)

    names = tuple(rule_name(r) for r in rules)
    return _pipeline, (("tuned", *names) if records is not None else names)


def describe_pipeline(records: Any) -> str:
    return "cpu (edgepack rules" + (", tuned)" if records is not None else ")")
