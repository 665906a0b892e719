"""armv7 (rpi3): two ways the pinned TVM/LLVM made wrong armv7 code, and the target that avoids them
(docs/armv7.md):

* an ``arch-linux-env`` mtriple is not normalised by LLVM, which then calls libgcc's soft-float
  float <-> int64 helpers with the hard-float convention (RESIZE_BILINEAR came out wrong);
* LLVM 22's ARM load/store optimizer can clobber a live base register when it forms STM (some
  channels of float16 weight transposes came out wrong).

The end-to-end tests build one TFLite layer of each kind for rpi3 and run it under qemu-arm."""

import dataclasses
import re

import pytest
from tflite_factory import bilinear_upsample, fp16_pointwise_conv

from edgepack.compiling import compile_model
from edgepack.profiles import get_profile, parse_profile, profile_from_dict
from edgepack.validation import validate

OPTION = "-arm-load-store-opt=false"
# libgcc's float <-> 64-bit integer conversions; on ARM EABI each is the same code as an __aeabi_
# function, which takes and returns floats in core registers (soft-float) even on armhf
GNU_CONVERSIONS = ("__floatdisf", "__floatundisf", "__fixsfdi", "__fixunssfdi",
                   "__floatdidf", "__floatundidf", "__fixdfdi", "__fixunsdfdi")


def _custom_profile(target: dict, host_target: dict | None = None):
    data = {"name": "custom", "triple": "arm-linux-gnueabihf", "target": target,
            "toolchain": {"cc": "arm-linux-gnueabihf-gcc", "cxx": "arm-linux-gnueabihf-g++"}}
    if host_target is not None:
        data["host_target"] = host_target
    return parse_profile(data)


def test_rpi3_target_is_what_the_pinned_llvm_needs():
    rpi3 = get_profile("rpi3")
    assert rpi3.target["mtriple"] == "armv7a-unknown-linux-gnueabihf"
    assert rpi3.target["cl-opt"] == [OPTION]
    exported = rpi3.tvm_target().export()  # what TVM builds with
    assert exported["mtriple"] == "armv7a-unknown-linux-gnueabihf" and exported["cl-opt"] == [OPTION]
    for name in ("rpi4", "rpi5", "host", "android-arm64"):  # 64-bit and x86 targets are left alone
        target = get_profile(name).target
        assert "cl-opt" not in target and "unknown" not in target.get("mtriple", "")


def test_user_arm32_profiles_are_corrected_and_can_keep_the_optimizer():
    armv7 = _custom_profile({"kind": "llvm", "mtriple": "armv7a-linux-gnueabihf", "mattr": ["+neon"]})
    assert armv7.target == {"kind": "llvm", "mtriple": "armv7a-unknown-linux-gnueabihf", "mattr": ["+neon"],
                            "cl-opt": [OPTION]}
    thumb = _custom_profile({"kind": "llvm", "mtriple": "thumbv7-linux-gnueabihf", "cl-opt": ["-foo:bool=1"]})
    assert thumb.target["mtriple"] == "thumbv7-unknown-linux-gnueabihf"
    assert thumb.target["cl-opt"] == ["-foo:bool=1", OPTION]
    chosen = _custom_profile({"kind": "llvm", "mtriple": "armv7a-unknown-linux-gnueabihf",
                              "cl-opt": ["-arm-load-store-opt:bool=true"]})
    assert chosen.target["cl-opt"] == ["-arm-load-store-opt:bool=true"]  # the profile's own choice wins
    gpu = _custom_profile({"kind": "opencl", "device": "mali"}, {"kind": "llvm", "mtriple": "armv7a-linux-gnueabihf"})
    assert "cl-opt" not in gpu.target
    assert gpu.host_target == {"kind": "llvm", "mtriple": "armv7a-unknown-linux-gnueabihf", "cl-opt": [OPTION]}
    for triple in ("aarch64-linux-gnu", "arm64-apple-ios", "x86_64-linux-gnu"):
        assert _custom_profile({"kind": "llvm", "mtriple": triple}).target == {"kind": "llvm", "mtriple": triple}
    # a build's manifest records its profile; one recorded before the fix is read back corrected
    old = get_profile("rpi3").to_dict()
    old["target"] = {**{k: v for k, v in old["target"].items() if k != "cl-opt"}, "mtriple": "armv7a-linux-gnueabihf"}
    assert profile_from_dict(old).target == get_profile("rpi3").target


def test_rpi3_code_calls_libgcc_conversions_by_their_eabi_names():
    """A bilinear resize converts float32 <-> int64: on 32-bit ARM those are libgcc calls. With the
    GNU names LLVM passed and read the floats in s0, where libgcc has them in r0/r1."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6, 6, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.image.resize2d(x, [12, 12], layout="NHWC", method="linear",
                                                coordinate_transformation_mode="half_pixel"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    executable = tvm.compile(bb.get(), target=get_profile("rpi3").tvm_target())
    llvm_module = next(m for m in executable.mod.imports if m.kind == "llvm")
    calls = set(re.findall(r"\bbl\s+(\w+)", llvm_module.inspect_source("asm")))
    assert calls & {"__aeabi_ul2f", "__aeabi_f2lz"}, calls
    assert not calls & set(GNU_CONVERSIONS), calls


@pytest.mark.slow
@pytest.mark.parametrize("make_model", [fp16_pointwise_conv, bilinear_upsample], ids=lambda f: f.__name__)
def test_mediapipe_layers_match_litert_on_rpi3_emulator(tmp_path, make_model):
    """fp16_pointwise_conv: before the fix, channels 17-23 of every pixel were wrong on rpi3 (max abs
    error 4.8); bilinear_upsample: 1141 of 1152 values wrong (max abs error 0.89). rpi4 and host exact."""
    model = make_model(tmp_path / "layer.tflite")
    build = compile_model(model, "rpi3", tmp_path / "rpi3").output_dir
    report = validate(build, "emulator")
    assert report.passed, [(o.name, o.max_abs_error, o.mismatched) for o in report.outputs]
    assert report.outputs[0].max_abs_error < 1e-4


@pytest.mark.slow
def test_pinned_llvm_still_miscompiles_without_the_option(tmp_path):
    """The reason for ``-arm-load-store-opt=false``, kept as a canary: the float16 weight transpose of
    MediaPipe's layers (cast to float32, OHWI to HWIO, in TVM's plain loop nest, as it ran on the device
    before edgepack folded kernels on constants at compile time) is wrong under qemu-arm when built with
    the load/store optimizer on. When this fails, the pinned TVM's LLVM has the fix (LLVM issue
    #223630) and edgepack.profiles.ARM32_LLVM_OPTIONS can go."""
    import numpy as np
    import tvm
    from tvm import relax

    from edgepack.run.c_runner import run_c_runner, runner_for_profile
    from edgepack.tensors import TensorSpec
    from edgepack.toolchain.compilers import emulator_command, find_compilers
    from edgepack.toolchain.model_library import export_model_shared, model_meta_text

    rpi3 = get_profile("rpi3")
    unsafe = dataclasses.replace(rpi3, target={k: v for k, v in rpi3.target.items() if k != "cl-opt"})
    bb = relax.BlockBuilder()
    weights = relax.Var("w", relax.TensorType((24, 1, 1, 96), "float16"))
    with bb.function("main", [weights]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.permute_dims(relax.op.astype(weights, "float32"), [1, 2, 3, 0]))
        bb.emit_func_output(out)
    inputs = (TensorSpec("w", "float16", (24, 1, 1, 96)),)
    outputs = (TensorSpec("out", "float32", (1, 1, 96, 24)),)
    w = np.random.default_rng(0).normal(0, 0.3, (24, 1, 1, 96)).astype(np.float16)
    expected = np.transpose(w.astype(np.float32), (1, 2, 3, 0))
    wrong = {}
    for name, profile in (("unsafe", unsafe), ("rpi3", rpi3)):
        compilers = find_compilers(profile)
        library = tmp_path / f"{name}.so"
        export_model_shared(tvm.compile(bb.get(), target=profile.tvm_target()), library, compilers.cxx,
                            meta_text=model_meta_text(inputs, outputs), cc=compilers.cc)
        result = run_c_runner(emulator_command(profile), runner_for_profile(profile), library, {"w": w}, inputs,
                              outputs)
        wrong[name] = int(np.count_nonzero(result.outputs[0] != expected))
    assert wrong["rpi3"] == 0, wrong
    # seen with LLVM 22: 672 of 2304 values wrong
    assert wrong["unsafe"] > 0, "the pinned LLVM no longer miscompiles this transpose: see docs/armv7.md"
