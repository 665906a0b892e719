"""edgepack's default CPU schedules (edgepack/backends/cpu/schedules/): every kernel of an untuned CPU
build gets one, the build says which, and the scheduled code computes what ONNX Runtime / LiteRT do,
here and under qemu for the ARM profiles (their code is another compile: 4 NEON lanes, 32 or 16
vector registers)."""

import json
import logging

import numpy as np
import pytest
from conftest import run_cli
from model_factory import (
    onnx_conv_lstm_classifier,
    onnx_depthwise_pointwise,
    onnx_fire_module,
    onnx_hardswish_convs,
    onnx_layer_zoo,
    onnx_odd_channels,
    onnx_squeeze_excitation,
    onnx_stems,
    onnx_streamed_depthwise,
    onnx_strided_convs,
    onnx_winograd_convs,
)
from tflite_factory import blazeface_block

from edgepack.backends.cpu.schedules import CpuInfo, default_rules
from edgepack.backends.cpu.schedules.reduction import Reduction
from edgepack.backends.cpu.schedules.tiling import Tile, choose_tile, depthwise_accumulators
from edgepack.compiling import compile_model
from edgepack.validation import validate

RULES = {"cpu.Conv2D", "cpu.Matmul", "cpu.Pool", "cpu.Reduction", "cpu.WinogradInput", "cpu.WinogradOutput",
         "cpu.Injective"}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return onnx_layer_zoo(tmp_path_factory.mktemp("zoo") / "zoo.onnx")


def _cpu_report(build_dir):
    return json.loads((build_dir / "manifest.json").read_text())["extra"]["cpu"]


def _scheduled_build(model, profile: str, tmp_path):
    """``model`` compiled for ``profile`` and its schedule report, every kernel taken by a rule."""
    build = compile_model(model, profile, tmp_path / profile).output_dir
    report = _cpu_report(build)
    assert report["unscheduled"] == [], report
    return build, report


def _assert_matches_reference(build, on: str, threads=(None,)) -> None:
    """The build's outputs equal the reference runtime's (``validate``) where ``on`` says, at each thread
    count (None: the place's own setting)."""
    for count in threads:
        report = validate(build, on, threads=count)
        assert report.passed, [(o.name, o.max_abs_error, o.mismatched) for o in report.outputs]


def test_cpu_info_reads_the_target_not_this_machine():
    import tvm

    def info(spec):
        return CpuInfo.of(tvm.target.Target(spec))

    assert info({"kind": "llvm", "mcpu": "znver4"}) == CpuInfo("x86_64", 512, 32, "vnni")
    # AVX-512 without VNNI, and AVX2: 16-bit multiply-adds of pairs
    assert info({"kind": "llvm", "mcpu": "skylake-avx512"}) == CpuInfo("x86_64", 512, 32, "pmaddwd")
    assert info({"kind": "llvm", "mcpu": "haswell"}) == CpuInfo("x86_64", 256, 16, "pmaddwd")
    assert info({"kind": "llvm", "mcpu": "alderlake"}) == CpuInfo("x86_64", 256, 16, "avxvnni")
    assert info({"kind": "llvm", "mcpu": "sandybridge"}) == CpuInfo("x86_64", 256, 16)  # AVX without AVX2
    assert info({"kind": "llvm"}).vector_bits == 128  # no mcpu: LLVM emits SSE2 only
    assert info({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}) == CpuInfo("aarch64", 128, 32,
                                                                                                 "smull")
    assert info({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76"}).dot_product == "sdot"
    assert info({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a72"}).dot_product == "smull"
    # Armv9 cores have the 8-bit matrix multiply (+i8mm); a profile can also declare it
    assert info({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a720"}).dot_product == "smmla"
    assert info({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76",
                 "mattr": ["+i8mm"]}).dot_product == "smmla"
    rpi3 = {"kind": "llvm", "mtriple": "armv7a-unknown-linux-gnueabihf", "mcpu": "cortex-a53",
            "mattr": ["+neon", "+vfp4", "+thumb2"], "mfloat-abi": "hard"}
    assert info(rpi3) == CpuInfo("arm", 128, 16, "vmull")
    assert info({**rpi3, "mattr": ["-neon"]}) == CpuInfo("arm", 32, 16)


def test_register_tiles_fit_the_registers_and_divide_their_axes():
    avx512, neon32 = CpuInfo("x86_64", 512, 32), CpuInfo("arm", 128, 16)
    for vector, register, group in [(144, 56, None), (24, 56, None), (1000, 1, None), (136, 28, 34), (3, 7, None),
                                    (1280, 7, None), (64, 111, None)]:
        for cpu in (avx512, neon32):
            tile = choose_tile(vector, register, cpu.lanes(32), cpu, group)
            assert (group or vector) % (tile.lanes * tile.vectors) == 0 and register % tile.repeat == 0
            assert tile.lanes <= cpu.lanes(32)  # a vector never spans two registers
            assert tile.accumulators <= cpu.accumulators
            assert tile.accumulators + tile.vectors + 1 <= cpu.vector_registers
            depthwise = choose_tile(vector, register, cpu.lanes(32), cpu, group, depthwise=True)
            assert depthwise.accumulators <= depthwise_accumulators(cpu) < cpu.accumulators
    assert choose_tile(144, 56, 16, avx512).lanes == 16  # 144 = 9 x 16 (not 24-wide vectors)
    assert choose_tile(24, 56, 16, avx512).lanes == 8  # a power of two that fills half a register
    assert choose_tile(42, 32, 16, avx512).lanes == 14  # else the largest divisor that fits: 14, not 2
    assert choose_tile(136, 28, 16, avx512, group=34).lanes == 2  # a vector never crosses a group


def test_a_tile_whose_weights_outgrow_l1_shares_them_among_more_pixels():
    """resnet50-light's 14x14 256 -> 1024 1x1 convolution: 2 pixels x 8 vectors (the most accumulators)
    read a 128 KB slice of weights per tile, from L2 at every tile; 7 pixels x 2 vectors read 32 KB, each
    weight vector used 7 times. A short reduction keeps the tile of the most accumulators, and the rule
    holds for every target (NEON's 16-byte vectors: 16 x 4 x 1024 x 4 bytes)."""
    avx512, neon64 = CpuInfo("x86_64", 512, 32), CpuInfo("aarch64", 128, 32)
    assert choose_tile(1024, 14, 16, avx512) == Tile(16, 8, 2)  # no reduction given: the most accumulators
    assert choose_tile(1024, 14, 16, avx512, reduction=64) == Tile(16, 8, 2)  # 32 KB of weights: in L1
    assert choose_tile(1024, 14, 16, avx512, reduction=256) == Tile(16, 2, 7)
    assert choose_tile(256, 14, 4, neon64, reduction=1024).repeat == 7
    assert choose_tile(1024, 2, 16, avx512, reduction=256).repeat == 2  # no longer a row to share them along: as before


def test_a_depthwise_tile_writes_whole_pixels_where_its_output_leaves_the_cache():
    avx512, neon64, neon32 = CpuInfo("x86_64", 512, 32), CpuInfo("aarch64", 128, 32), CpuInfo("arm", 128, 16)
    # in cache: the tile that computes fastest (16 of 144 channels, 14 pixels that share their taps)
    assert choose_tile(144, 56, 16, avx512, depthwise=True) == Tile(16, 1, 14)
    assert choose_tile(384, 14, 16, avx512, depthwise=True) == Tile(16, 2, 7)
    assert choose_tile(24, 64, 8, avx512, depthwise=True) == Tile(8, 3, 4)  # every channel: 12 accumulators
    assert choose_tile(384, 14, 4, neon32, depthwise=True) == Tile(4, 1, 7)
    # streamed: every channel of a pixel, as many pixels as the accumulators allow
    assert choose_tile(144, 56, 16, avx512, depthwise=True, streamed=True) == Tile(16, 9, 1)
    assert choose_tile(96, 56, 16, avx512, depthwise=True, streamed=True) == Tile(16, 6, 2)
    assert choose_tile(32, 96, 4, neon64, depthwise=True, streamed=True) == Tile(4, 8, 1)
    # more channels than the accumulators hold (or than armv7's 16 registers allow): the usual tile
    for cpu, vector in ((avx512, 960), (neon64, 144), (neon32, 32)):
        lanes = cpu.lanes(32)
        assert choose_tile(vector, 56, lanes, cpu, depthwise=True, streamed=True) == \
            choose_tile(vector, 56, lanes, cpu, depthwise=True)
    assert choose_tile(144, 56, 16, avx512, streamed=True) == choose_tile(144, 56, 16, avx512)  # not depthwise


@pytest.fixture(scope="module")
def streamed_depthwise_model(tmp_path_factory):
    return onnx_streamed_depthwise(tmp_path_factory.mktemp("streamed") / "streamed.onnx")


def test_depthwise_convolutions_with_streamed_outputs_match_onnxruntime(streamed_depthwise_model, tmp_path):
    build = compile_model(streamed_depthwise_model, "host", tmp_path / "host").output_dir
    assert _cpu_report(build)["unscheduled"] == []
    _assert_matches_reference(build, "host", threads=(1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_depthwise_convolutions_with_streamed_outputs_compute_the_same_under_qemu(streamed_depthwise_model,
                                                                                   tmp_path, profile):
    build = compile_model(streamed_depthwise_model, profile, tmp_path / profile).output_dir
    _assert_matches_reference(build, "emulator", threads=(None, 2))


@pytest.fixture(scope="module")
def depthwise_pointwise_model(tmp_path_factory):
    return onnx_depthwise_pointwise(tmp_path_factory.mktemp("dwpw") / "dwpw.onnx")


def test_a_depthwise_convolution_and_the_pointwise_one_after_it_run_as_one_kernel(depthwise_pointwise_model,
                                                                                 tmp_path):
    build, report = _scheduled_build(depthwise_pointwise_model, "host", tmp_path)
    fused = {f["name"] for f in report["functions"] if f["schedule"] == "cpu.DepthwisePointwise"}
    # MobileNetV2's block (residual), its stride-2 block, BlazeFace's (channel crop, padded residual, ReLU)
    assert len(fused) == 3 and any("strided_slice" in name and "relu" in name for name in fused), fused
    # the 640-channel depthwise convolution stays a kernel of its own: one pixel's output is 2.5 KiB, and
    # the 1x1 convolution after it would have to compute one pixel at a time to keep its tile on the stack
    convolutions = [f["name"] for f in report["functions"] if f["schedule"] == "cpu.Conv2D"]
    assert len(convolutions) == 4 and not any(name.count("conv2d") > 1 for name in convolutions), convolutions
    _assert_matches_reference(build, "host", threads=(1, 2))


@pytest.fixture(scope="module")
def squeeze_excitation_model(tmp_path_factory):
    return onnx_squeeze_excitation(tmp_path_factory.mktemp("se") / "se.onnx")


def test_a_tensor_scaled_per_channel_and_the_projection_after_it_run_as_one_kernel(squeeze_excitation_model,
                                                                                   tmp_path):
    build, report = _scheduled_build(squeeze_excitation_model, "host", tmp_path)
    merged = [f for f in report["functions"] if "clip" in f["name"] and "conv2d" in f["name"]]
    # the two hard-sigmoid gates (72 and 960 channels); the sigmoid one FuseOps puts in the gate's kernel
    assert len(merged) == 2 and all(f["schedule"] == "cpu.Conv2D" for f in merged), merged
    assert not any("multiply" in f["name"] and f["schedule"] == "cpu.Injective" for f in report["functions"])
    # 72 channels: each tile scales its pixels into a stack buffer inside the convolution's loop nest;
    # 960: a tile's pixels would outgrow it, the scaling is a pass of its own before the convolution
    nests = {name: n for name, (_rule, n) in _loop_nests(squeeze_excitation_model, None).items()
             if "clip" in name and "conv2d" in name}
    assert sorted(nests.values()) == [1, 2], nests
    _assert_matches_reference(build, "host", threads=(1, 2))


def test_older_tuning_directories_keep_the_scaling_apart(squeeze_excitation_model):
    """Records tuned before the merge (``KernelForm.fused_scale`` off) name the kernels as they were."""
    from dataclasses import replace

    from edgepack.backends import get_backend
    from edgepack.backends.cpu.pipeline import UNTUNED_FORM
    from edgepack.frontends import import_model
    from edgepack.profiles import get_profile
    from edgepack.tuning import extract_tasks

    backend = get_backend("cpu")
    target = backend.tuning_target(get_profile("host"), num_cores=1, here=True)
    imported = import_model(squeeze_excitation_model, {})

    def merged(form) -> int:
        return sum("clip" in t.name and "conv2d" in t.name for t in extract_tasks(imported, backend, target, form)[0])

    assert merged(UNTUNED_FORM) == 2
    assert merged(replace(UNTUNED_FORM, fused_scale=False)) == 0


def test_prepacked_weights_leave_no_instructions_behind(depthwise_pointwise_model):
    """The weights a kernel's layout rewrite folded reach its call as constants: no tuple of them, no item
    taken from it, is left to run on every inference."""
    from edgepack.backends import backend_for
    from edgepack.frontends import import_model
    from edgepack.profiles import get_profile

    profile = get_profile("host")
    executable = backend_for(profile).build(import_model(depthwise_pointwise_model, {}), profile.tvm_target()).executable
    program = executable.as_text()
    assert "_prepacked" in program
    packing = [line for line in program.splitlines()  # the model's outputs are returned as a tuple
               if "vm.builtin.tuple_getitem" in line or ("vm.builtin.make_tuple" in line and "c[" in line)]
    assert packing == [], program


@pytest.fixture(scope="module")
def blazeface_block_model(tmp_path_factory):
    return blazeface_block(tmp_path_factory.mktemp("blazeface") / "block.tflite")


def test_a_cropped_tile_stores_its_whole_epilogue_from_the_accumulators(blazeface_block_model, tmp_path):
    """BlazeFace's block that widens its channels: the 1x1 convolution's 28 channels computed as 32 and
    cropped, then the residual input padded with zero channels, the add and the ReLU. All of it is stored
    from the tile's accumulators: no pass over the whole tensor after the convolution (the kernel's only
    loop nests are its weight rewrites, folded at compile time, and the parallel tile loop); left apart,
    the pad, the add and the ReLU made BlazeFace 11% slower at 1 thread and 17% at 2."""
    counts = _loop_nests(blazeface_block_model, {})
    [(rule, nests)] = [counts[n] for n in counts if "strided_slice" in n and "pad" in n and "relu" in n]
    assert rule == "cpu.DepthwisePointwise" and nests == 1, counts
    build = compile_model(blazeface_block_model, "host", tmp_path / "host").output_dir
    _assert_matches_reference(build, "host", threads=(1, 2))


def test_an_activation_that_reads_the_convolution_twice_is_stored_from_the_accumulators(tmp_path):
    """Hardswish, ``x * clip(x + 3, 0, 6) / 6``, after a cropped 1x1 convolution and after a depthwise one:
    its blocks read the convolution's output twice, so none of them was the only reader that TVM folds
    into the tile; left apart, each was a pass over the whole tensor (PP-OCR cls 14% slower at 1 thread,
    25% at 2). Every kernel is one loop nest besides its weight rewrites, and matches ONNX Runtime."""
    model = onnx_hardswish_convs(tmp_path / "hardswish.onnx")
    counts = _loop_nests(model, {})
    convolutions = [counts[n] for n in counts if "conv2d" in n and "multiply" in n]
    assert convolutions == [("cpu.Conv2D", 1)] * 2, counts
    build = compile_model(model, "host", tmp_path / "host").output_dir
    _assert_matches_reference(build, "host", threads=(1, 2))


@pytest.mark.parametrize("name", ["face_detection_short_range", "ppocr_cls", "mobilenetv2"])
def test_the_kernels_of_real_models_make_one_pass_over_their_output(models, name):
    """Every tiled kernel of BlazeFace, PP-OCR cls and MobileNetV2 is one loop nest besides its weight
    rewrites; a pooling kernel whose epilogue changes the shape (BlazeFace's max-pooled residual padded to
    more channels, added, ReLU'd) runs that epilogue as one more pass, not one per operator."""
    counts = _loop_nests(models[name].path, models[name].input_shapes)
    tiled = {"cpu.Conv2D", "cpu.DepthwisePointwise", "cpu.Matmul", "cpu.WinogradOutput"}
    assert all(n == 1 for rule, n in counts.values() if rule in tiled), counts
    assert all(n <= 2 for rule, n in counts.values() if rule == "cpu.Pool"), counts


def _loop_nests(model, shapes) -> dict[str, tuple[str, int]]:
    """Per kernel of ``model``'s untuned host build: its rule and how many loop nests it runs besides its
    weight rewrites (which are folded into the constants at compile time)."""
    import tvm
    from tvm import tirx

    from edgepack.backends.cpu.pipeline import UNTUNED_FORM, prepare_passes
    from edgepack.backends.scheduling import recording_schedule_pass
    from edgepack.frontends import import_model
    from edgepack.profiles import get_profile

    target = get_profile("host").tvm_target()
    record: dict[str, str] = {}
    with target:
        mod = tvm.transform.Sequential([*prepare_passes(target, UNTUNED_FORM),
                                        recording_schedule_pass(default_rules(), record)])(
            import_model(model, shapes or {}).mod)
    counts = {}
    for name, rule in record.items():
        root = mod[name].body.block.body
        nests = list(root.seq) if isinstance(root, tirx.SeqStmt) else [root]
        counts[name] = (rule, len(nests) - _layout_rewrites(nests))
    return counts


def _layout_rewrites(nests) -> int:
    import tvm
    import tvm_ffi

    def rewrites(nest) -> bool:
        found: list[bool] = []
        tvm_ffi.structural_walk(nest, [(tvm.s_tir.SBlock, lambda b: found.append(
            "meta_schedule.layout_rewrite_preproc" in b.annotations))], order="pre")
        return any(found)

    return sum(rewrites(nest) for nest in nests)


def test_the_fused_tile_keeps_the_pointwise_tile_and_fits_the_stack():
    from edgepack.backends.cpu.schedules.fused import MAX_TILE_BYTES

    avx512, neon32 = CpuInfo("x86_64", 512, 32), CpuInfo("arm", 128, 16)
    for cpu in (avx512, neon32):
        for channels, pixels, out in [(144, 56, 24), (576, 14, 96), (960, 7, 160), (32, 112, 16)]:
            alone = choose_tile(out, pixels, cpu.lanes(32), cpu)
            fused = pointwise_tile_of(channels, pixels, out, cpu)
            assert fused is None or (fused.repeat <= alone.repeat and fused.repeat * channels * 4 <= MAX_TILE_BYTES)
    assert pointwise_tile_of(144, 56, 24, avx512).repeat == choose_tile(24, 56, 16, avx512).repeat
    assert pointwise_tile_of(960, 7, 160, avx512).repeat == 1  # 7 pixels of 960 channels: 26 KiB


def pointwise_tile_of(channels: int, pixels: int, out: int, cpu):
    """The fused kernel's pointwise tile for a 1x1 convolution ``channels`` -> ``out`` over a row of
    ``pixels``, from a real kernel's anatomy."""
    import tvm
    from tvm import s_tir, te, topi

    from edgepack.backends.cpu.schedules.anatomy import reduction_anatomy
    from edgepack.backends.cpu.schedules.fused import pointwise_tile

    data = te.placeholder((1, pixels, pixels, channels), name="data")
    weight = te.placeholder((1, 1, channels, out), name="weight")
    func = te.create_prim_func([data, weight, topi.nn.conv2d_nhwc(data, weight, 1, 0, 1)])
    anatomy = reduction_anatomy(s_tir.Schedule(tvm.IRModule({"main": func})))
    return pointwise_tile(anatomy, channels * 4, cpu)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_fused_kernels_and_their_epilogues_compute_the_same_under_qemu(depthwise_pointwise_model,
                                                                                blazeface_block_model,
                                                                                tmp_path, profile):
    build = compile_model(depthwise_pointwise_model, profile, tmp_path / profile).output_dir
    assert sum(f["schedule"] == "cpu.DepthwisePointwise" for f in _cpu_report(build)["functions"]) == 3
    _assert_matches_reference(build, "emulator", threads=(None, 2))
    block = compile_model(blazeface_block_model, profile, tmp_path / f"{profile}-block").output_dir
    _assert_matches_reference(block, "emulator", threads=(None, 2))
    hardswish = onnx_hardswish_convs(tmp_path / "hardswish.onnx")
    _assert_matches_reference(compile_model(hardswish, profile, tmp_path / f"{profile}-hardswish").output_dir,
                              "emulator", threads=(None, 2))


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_scalings_merged_into_their_projection_compute_the_same_under_qemu(squeeze_excitation_model, tmp_path,
                                                                          profile):
    build, report = _scheduled_build(squeeze_excitation_model, profile, tmp_path)
    assert sum("clip" in f["name"] and "conv2d" in f["name"] for f in report["functions"]) == 2
    _assert_matches_reference(build, "emulator", threads=(None, 2))


def test_every_kernel_of_an_untuned_build_has_a_schedule_and_matches_onnxruntime(zoo, tmp_path):
    result = json.loads(run_cli("compile", str(zoo), "--profile", "host", "-o", str(tmp_path / "host"), "--json",
                                check=True).stdout)
    report = result["extra"]["cpu"]
    assert report["unscheduled"] == [] and set(report["schedules"]) == RULES, report["schedules"]
    assert report["num_functions"] == sum(report["schedules"].values())
    by_rule = {f["name"]: f["schedule"] for f in report["functions"]}
    assert by_rule["softmax1"] == by_rule["layer_norm1"] == "cpu.Reduction"
    assert by_rule["max_pool2d1"] == by_rule["mean1"] == "cpu.Pool"
    assert result["target"]["mcpu"] not in (None, "", "native")  # this machine's CPU, named for LLVM
    text = run_cli("compile", str(zoo), "--profile", "host", "-o", str(tmp_path / "again"), check=True).stdout
    assert "unscheduled: none" in text and "cpu.Conv2D" in text
    report = validate(tmp_path / "host", "host")
    assert report.passed, [(o.name, o.max_abs_error) for o in report.outputs]
    # threads: the same numbers on one thread and on every core
    for threads in (1, 2):
        assert validate(tmp_path / "host", "host", threads=threads).passed


def test_a_kernel_no_rule_takes_is_named_in_the_summary(tmp_path):
    """ONNX TopK becomes TOPI's hand-written sort (no blocks to schedule): it keeps TVM's code, said aloud."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1)], "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 50])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, [1, 5]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 5])],
        [numpy_helper.from_array(np.array([5], np.int64), "k")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "topk.onnx"))
    result = run_cli("compile", str(tmp_path / "topk.onnx"), "--profile", "host", "-o", str(tmp_path / "b"),
                     check=True)
    report = _cpu_report(tmp_path / "b")
    assert report["unscheduled"], report
    assert "unscheduled: " in result.stdout and report["unscheduled"][0] in " ".join(result.stdout.split())
    assert validate(tmp_path / "b", "host").passed


def test_rules_leave_kernels_of_other_forms_alone():
    """A rule returns None for what is not its kernel, so the next one is tried (never a wrong schedule)."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 33), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(relax.op.exp(x), axis=-1))
        bb.emit_func_output(out)
    with tvm.target.Target({"kind": "llvm"}):
        mod = relax.transform.LegalizeOps()(bb.get())
    func = next(f for _g, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and "softmax" in _g.name_hint)
    target = tvm.target.Target({"kind": "llvm"})
    taken = [rule.rule_name for rule in default_rules() if rule.apply(func, target) is not None]
    assert taken[0] == "cpu.Reduction"  # several reductions: not a tiled rule's


def _vector_extents(mod) -> list[int]:
    import tvm_ffi
    from tvm import tirx

    found = []

    def visit(loop):
        if loop.kind == tirx.ForKind.VECTORIZED:
            found.append(int(loop.extent))

    tvm_ffi.structural_walk(mod["main"].body, [(tirx.For, visit)], order="pre")
    return found


def _injective(compute, shapes, target_spec):
    """The Injective rule's schedule of one TE kernel, for a target that need not be this machine."""
    import tvm
    from tvm import te

    from edgepack.backends.cpu.schedules import Injective

    inputs = [te.placeholder(shape, name=f"a{i}") for i, shape in enumerate(shapes)]
    func = te.create_prim_func([*inputs, compute(*inputs)])
    sch = Injective().apply(func, tvm.target.Target(target_spec))
    assert sch is not None
    return sch.mod


AVX512 = {"kind": "llvm", "mcpu": "znver4"}
NEON64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


def test_vectors_stay_inside_what_the_indices_divide_a_row_into():
    """16 lanes straddling an ``% 8`` of the innermost index were computed wrongly by TVM's vectorizer
    (ONNX RotaryEmbedding on AVX-512); the vector stays within the period."""
    from tvm import te

    def rotate(x):  # rows of 32 = 4 heads of 8, each head's halves swapped
        return te.compute((6, 32), lambda r, i: x[r, i // 8 * 8 + (i % 8 + 4) % 8] * 2.0)

    assert _vector_extents(_injective(rotate, [(6, 32)], AVX512)) == [8]
    assert _vector_extents(_injective(lambda x: te.compute((6, 32), lambda r, i: x[r, i] * 2.0),
                                      [(6, 32)], AVX512)) == [16]


def test_blocks_without_a_vector_form_stay_scalar_and_compile_for_every_cpu():
    """sinh/cosh have no vector lowering in TVM 0.27 ("unknown intrinsic"); an index computed in floating
    point (nearest resize) moved a row on NEON when vectorised (FMA contraction)."""
    import tvm
    from tvm import te, tirx, topi

    def nearest(x):
        def value(y, i):
            row = tirx.Cast("int64", tirx.ceil((tirx.Cast("float32", y) + 0.5) * 0.2857143 - 1.0))
            return x[tirx.max(tirx.min(row, 1), 0), i]
        return te.compute((7, 64), value)

    for compute in (topi.sinh, topi.cosh, nearest):
        for spec in (AVX512, NEON64):
            mod = _injective(compute, [(2, 64)], spec)
            assert _vector_extents(mod) == []
            tvm.compile(mod, target=tvm.target.Target(spec))


NEON32 = {"kind": "llvm", "mtriple": "armv7a-linux-gnueabihf", "mattr": ["+neon"]}


@pytest.mark.parametrize("spec", [AVX512, NEON64, NEON32], ids=["avx512", "neon64", "neon32"])
def test_a_register_tile_goes_from_the_registers_to_its_output(spec):
    """The accumulators of a tile stay in registers through its epilogue (bias, clip) to the output: no
    array of vectors on the stack for the epilogue to read back."""
    import re

    import tvm
    from tvm import topi

    from edgepack.backends import get_backend

    sch, target = _scheduled_pointwise(spec, (1, 14, 14, 96), 48, lambda y: topi.clip(y, 0.0, 6.0))
    ir = tvm.compile(sch.mod, target=target, tir_pipeline=get_backend("cpu").tir_pipeline()).mod.inspect_source("ll")
    assert re.findall(r"alloca \[\d+ x <\d+ x float>\]", ir) == []


def _scheduled_pointwise(spec, shape, channels: int, epilogue):
    """A channels-last 1x1 convolution of ``shape`` to ``channels``, ``epilogue`` after it, as the
    ``cpu.Conv2D`` rule schedules it for the target ``spec``."""
    import tvm
    from tvm import te, topi

    from edgepack.backends.cpu.schedules import Conv2D

    x = te.placeholder(shape, name="x")
    w = te.placeholder((1, 1, shape[-1], channels), name="w")
    func = te.create_prim_func([x, w, epilogue(topi.nn.conv2d_nhwc(x, w, 1, 0, 1))])
    target = tvm.target.Target(spec)
    sch = Conv2D().apply(func, target)
    assert sch is not None
    return sch, target


@pytest.mark.parametrize("spec", [AVX512, NEON64, NEON32], ids=["avx512", "neon64", "neon32"])
def test_register_tiles_live_on_the_stack_not_in_the_workspace_pool(spec):
    """TVM asks the runtime's workspace pool for a ``local`` buffer (a register tile's accumulators)
    once per iteration of a parallel loop, and LLVM then keeps the tile in memory; the CPU backend's TIR
    pipeline gives it a stack slot (PP-OCR's 24x96 pointwise convolution: 6.9 -> 3.2 us)."""
    import tvm
    from tvm import topi

    from edgepack.backends import get_backend

    sch, target = _scheduled_pointwise(spec, (1, 24, 96, 8), 8, topi.nn.relu)
    assert "T.parallel" in sch.mod.script()
    pool_call = "load ptr, ptr @__TVMBackendAllocWorkspace"
    stock = tvm.compile(sch.mod, target=target).mod.inspect_source("ll")
    ours = tvm.compile(sch.mod, target=target, tir_pipeline=get_backend("cpu").tir_pipeline()).mod.inspect_source("ll")
    assert pool_call in stock and pool_call not in ours


def test_calls_on_constants_that_make_tensors_from_nothing_are_not_folded(tmp_path):
    """Folding ``zeros`` of an empty shape made a constant TVM's runtime cannot load ("Invalid DLTensor
    file format", ONNX test_tril_zero on devices); zeros and broadcasts stay loops, weights fold."""
    import onnx_conformance as oc
    import tvm
    from tvm import relax

    from edgepack.backends import backend_for
    from edgepack.frontends import import_model
    from edgepack.profiles import get_profile

    model, inputs, _expected = oc.load_case(oc.node_test_dir() / "test_tril_zero")
    path = tmp_path / "tril.onnx"
    import onnx

    onnx.save(model, str(path))
    imported = import_model(path, {name: tuple(v.shape) for name, v in inputs.items()})
    profile = get_profile("host")
    executable = backend_for(profile).build(imported, profile.tvm_target()).executable
    executable.export_library(str(tmp_path / "model.so"))
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "model.so")), tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(inputs[n]) for n in ("x", "k")))
    assert tuple(out.shape) == (3, 0, 5)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_default_schedules_compute_the_same_under_qemu(zoo, tmp_path, profile):
    build = compile_model(zoo, profile, tmp_path / profile).output_dir
    report = _cpu_report(build)
    assert report["unscheduled"] == [] and set(report["schedules"]) == RULES
    _assert_matches_reference(build, "emulator", threads=(None, 2))


def _untuned_kernels(model_path, profile: str):
    """The CPU backend, ``profile``'s target, and the kernels an untuned build of the model forms (by
    task name), before their default schedules."""
    from edgepack.backends import get_backend
    from edgepack.backends.cpu.pipeline import UNTUNED_FORM
    from edgepack.frontends import import_model
    from edgepack.profiles import get_profile
    from edgepack.tuning import extract_tasks

    backend = get_backend("cpu")
    target = get_profile(profile).tvm_target()
    tasks, extracted = extract_tasks(import_model(model_path, {}), backend, target, UNTUNED_FORM)
    return backend, target, {task.name: kernel.dispatched[0] for task, kernel in zip(tasks, extracted)}


@pytest.fixture(scope="module")
def stems_model(tmp_path_factory):
    return onnx_stems(tmp_path_factory.mktemp("stems") / "stems.onnx")


@pytest.mark.parametrize("profile", ["host", "rpi4", "rpi3"])
def test_a_first_convolution_copies_its_padded_colours_unrolled(stems_model, profile):
    """3 colour channels make no SIMD vector: each tile's padded copy of the image is unrolled (straight-line
    code, its bounds checks folded per row and column), not a loop nest copying element by element
    (MobileNetV2's first convolution on a Zen 4 core: 248 -> 219 us), for AVX-512, aarch64 and armv7 NEON,
    3x3, 5x5 and 7x7 windows; host and qemu runs of the same code: ``test_padded_convolutions_*``."""
    from tvm import tirx

    backend, target, kernels = _untuned_kernels(stems_model, profile)
    copies = []
    for name, func in kernels.items():
        if "conv2d" not in name:
            continue  # the transpositions to and from channels-last
        rule, sch = backend.default_schedule(func, target)
        assert rule == "cpu.Conv2D", name
        [pad] = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.startswith("pad")]
        tile, *copy = sch.get_loops(pad)
        assert sch.get(tile).kind == tirx.ForKind.PARALLEL
        copies.append([(sch.get(loop).kind, int(sch.get(loop).extent)) for loop in copy])
    assert len(copies) == 3 and all(kind == tirx.ForKind.UNROLLED for copy in copies for kind, _ in copy), copies
    assert sorted(copy[0][1] for copy in copies) == [3, 5, 7]  # rows of the window, colours innermost
    assert all(copy[-1][1] == 3 for copy in copies)


@pytest.fixture(scope="module")
def strided_model(tmp_path_factory):
    return onnx_strided_convs(tmp_path_factory.mktemp("strided") / "strided.onnx")


@pytest.mark.parametrize("profile", ["host", "rpi4", "rpi3"])
def test_an_input_that_several_channel_tiles_read_is_padded_once(strided_model, profile):
    """Each tile's padded copy of its pixels would be made again by every tile of output channels: with
    several of them, the kernel pads its input once, in a parallel, vectorized pass before its tiles
    (resnet50-light's 3x3 stride-2 convolutions 5-14% faster on a Zen 4 core), for AVX-512, aarch64 and
    armv7 NEON; host and qemu runs of the same code: ``test_padded_convolutions_*``."""
    from tvm import tirx

    backend, target, kernels = _untuned_kernels(strided_model, profile)
    passes = []
    for name, func in kernels.items():
        if "conv2d" not in name:
            continue
        rule, sch = backend.default_schedule(func, target)
        assert rule == "cpu.Conv2D", name
        [pad] = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint.startswith("pad")]
        others = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if not sch.get(b).same_as(sch.get(pad))]
        padded = sch.get_loops(pad)
        assert not any(sch.get(padded[0]).same_as(sch.get(loop)) for b in others for loop in sch.get_loops(b))
        passes.append((sch.get(padded[0]).kind, sch.get(padded[-1]).kind))
    assert passes == [(tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED)] * 2, passes


PADDED_MODELS = ["stems_model", "strided_model"]  # the two ways a tile gets its padding: copied, padded once


@pytest.mark.parametrize("model", PADDED_MODELS)
def test_padded_convolutions_match_onnxruntime(model, request, tmp_path):
    build = compile_model(request.getfixturevalue(model), "host", tmp_path / "host").output_dir
    _assert_matches_reference(build, "host", threads=(1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
@pytest.mark.parametrize("model", PADDED_MODELS)
def test_padded_convolutions_compute_the_same_under_qemu(model, request, tmp_path, profile):
    build = compile_model(request.getfixturevalue(model), profile, tmp_path / profile).output_dir
    _assert_matches_reference(build, "emulator", threads=(None, 2))


@pytest.fixture(scope="module")
def winograd_model(tmp_path_factory):
    return onnx_winograd_convs(tmp_path_factory.mktemp("winograd") / "winograd.onnx")


def _winograd_kernels(build) -> dict[str, str]:
    return {f["name"]: f["schedule"] for f in _cpu_report(build)["functions"] if "winograd" in f["name"]}


@pytest.mark.parametrize("tile", [2, 4])
def test_winograd_transforms_invert_to_the_direct_convolution(tile):
    """F(2x2, 3x3) and F(4x4, 3x3) in NumPy with the module's own matrices and weight transform: the
    products of transformed windows and weights, transformed back, are the direct convolution."""
    from edgepack.backends.cpu.winograd import ALGORITHMS, transformed_weights

    algorithm = ALGORITHMS[tile]
    alpha, bt, at = algorithm.alpha, algorithm.bt, algorithm.at
    rng = np.random.default_rng(0)
    d = rng.normal(size=(alpha, alpha, 5))  # one input window, 5 channels
    g = rng.normal(size=(3, 3, 3, 5))  # OHWI: 3 output channels
    v = np.einsum("ai,ijc,bj->abc", bt, d, bt).reshape(alpha * alpha, 5)
    u = transformed_weights(g, algorithm)  # [alpha * alpha, c, k]
    m = np.einsum("ec,eck->ek", v, u).reshape(alpha, alpha, 3)
    y = np.einsum("ra,abk,sb->rsk", at, m, at)
    direct = np.array([[[np.sum(d[r:r + 3, s:s + 3, :] * g[k].reshape(3, 3, 5)) for k in range(3)]
                        for s in range(tile)] for r in range(tile)])
    np.testing.assert_allclose(y, direct, rtol=1e-9, atol=1e-9)


def test_winograd_picks_the_algorithm_that_multiplies_least():
    from edgepack.backends.cpu.pipeline import UNTUNED_FORM
    from edgepack.backends.cpu.winograd import choose

    assert choose(56, 56, 4).m == 4 and choose(7, 7, 4).m == 4 and choose(13, 13, 4).m == 4
    assert choose(5, 6, 4).m == 2  # 9 tiles of 16 against 4 of 36: a tie goes to the smaller tile
    assert choose(56, 56, 2).m == 2  # a tuning directory made before F(4x4, 3x3)
    # where each transformed weight must serve 16 tiles (untuned builds): 7x7 has 4 tiles of F(4x4), 16 of F(2x2)
    assert choose(7, 7, 4, 16).m == 2 and choose(14, 14, 4, 16).m == 4 and choose(13, 13, 4, 16).m == 4
    assert UNTUNED_FORM.winograd_reuse == 16


def test_winograd_spends_a_size_budget_where_it_saves_the_most_multiplies():
    """The transformed weights are (m + 2)^2 / 9 the weights: within a budget of bytes, the convolutions of
    large images and few channels (small weights serving many tiles) come first, one that F(4x4) would
    overrun gets F(2x2) where that fits, and the rest stay direct."""
    from edgepack.backends.cpu.pipeline import UNTUNED_FORM
    from edgepack.backends.cpu.winograd import Candidate, within_budget

    early = Candidate(("early",), 1, 160, 160, 16 * 16 * 9 * 4)  # 9 KiB of weights, 1600 tiles of F(4x4)
    middle = Candidate(("middle",), 1, 40, 40, 64 * 64 * 9 * 4)  # 144 KiB
    deep = Candidate(("deep",), 1, 10, 10, 256 * 256 * 9 * 4)  # 2.25 MiB for 9 tiles of F(4x4)
    everything = within_budget([deep, middle, early], 1e9, 4, 16)
    assert {k[0]: a.m for k, a in everything.items()} == {"early": 4, "middle": 4, "deep": 2}
    some = within_budget([deep, middle, early], early.extra(everything[("early",)]) + 200_000, 4, 16)
    assert {k[0]: a.m for k, a in some.items()} == {"early": 4, "middle": 2}  # 288 KiB more for F(4x4)
    assert within_budget([deep, middle, early], 0, 4, 16) == {}
    assert UNTUNED_FORM.winograd_budget == 0.25


def _assert_winograd_kernels(build, caplog) -> None:
    kernels = sorted(_winograd_kernels(build).values())
    assert kernels.count("cpu.WinogradInput") == 2 and kernels.count("cpu.WinogradOutput") == 2, kernels
    assert "1 convolution(s) as Winograd F(4x4, 3x3)" in caplog.text
    assert "1 convolution(s) as Winograd F(2x2, 3x3)" in caplog.text


def test_winograd_convolutions_match_onnxruntime(winograd_model, tmp_path, caplog):
    """Tiles that overhang the output, with and without padding, batch 4: F(4x4, 3x3) for one
    convolution, F(2x2, 3x3) for the other, each as its transforms' rules and a matrix product, and
    the outputs are ONNX Runtime's at 1 and 2 threads."""
    caplog.set_level(logging.INFO, logger="edgepack.schedules")
    build = compile_model(winograd_model, "host", tmp_path / "host").output_dir
    _assert_winograd_kernels(build, caplog)
    _assert_matches_reference(build, "host", threads=(1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_winograd_convolutions_compute_the_same_under_qemu(winograd_model, tmp_path, profile, caplog):
    caplog.set_level(logging.INFO, logger="edgepack.schedules")
    build = compile_model(winograd_model, profile, tmp_path / profile).output_dir
    _assert_winograd_kernels(build, caplog)
    _assert_matches_reference(build, "emulator")


@pytest.mark.parametrize("profile", ["host", "rpi4", "rpi3"])
def test_a_concatenating_output_transform_stores_whole_vectors(tmp_path, profile):
    """SqueezeNet's fire module: the concatenation of the 1x1 and the 3x3 (Winograd) expansions fuses
    into the output transform, whose tiles overhang the 27x27 output. Its store goes out in SIMD vectors
    for AVX-512, aarch64 and armv7 NEON; as a loop over the channel vectors, TVM stored every vector lane
    by lane (SqueezeNet's 55x55x128 module on a Zen 4 core: 146 -> 68 us); host and qemu runs of the
    same code are test_winograd_convolutions_*."""
    import re

    import tvm

    backend, target, kernels = _untuned_kernels(onnx_fire_module(tmp_path / "fire.onnx"), profile)
    [func] = [f for name, f in kernels.items() if "winograd_output" in name and "concat" in name]
    rule, sch = backend.default_schedule(func, target)
    assert rule == "cpu.WinogradOutput"
    ir = tvm.compile(sch.mod, target=target, tir_pipeline=backend.tir_pipeline()).mod.inspect_source("ll")
    assert re.findall(r"store <\d+ x float>", ir) and re.findall(r"store float ", ir) == []


def test_output_channels_are_padded_to_whole_vectors_only_where_that_costs_little():
    from edgepack.backends.cpu.channels import padded_channels

    assert [padded_channels(c, 16) for c in (36, 28, 42, 56, 1000, 1001, 21)] == [40, 32, 48, 64, 1008, 1008, 24]
    assert [padded_channels(c, 16) for c in (16, 24, 40, 96, 6, 2)] == [16, 24, 40, 96, 6, 2]  # as they are
    assert [padded_channels(c, 4) for c in (21, 1001, 1000, 6, 3)] == [24, 1004, 1000, 6, 3]  # NEON
    assert padded_channels(37, 1) == 37  # no SIMD


@pytest.fixture(scope="module")
def odd_channels_model(tmp_path_factory):
    return onnx_odd_channels(tmp_path_factory.mktemp("odd") / "odd.onnx")


def _assert_padded(build, caplog) -> None:
    assert "3 convolution(s) with output channels padded to whole SIMD vectors" in caplog.text
    kernels = {f["name"]: f["schedule"] for f in _cpu_report(build)["functions"]}
    cropped = [name for name in kernels if "strided_slice" in name]
    assert len(cropped) == 3 and all(kernels[name] == "cpu.Conv2D" for name in cropped), kernels


def test_padded_output_channels_match_onnxruntime(odd_channels_model, tmp_path, caplog):
    """Each convolution computes whole vectors of channels and stores the ones it keeps, through its
    bias, the residual add and ReLU, and the NCHW output transpose: ONNX Runtime's outputs at 1 and 2
    threads."""
    caplog.set_level(logging.INFO, logger="edgepack.schedules")
    build = compile_model(odd_channels_model, "host", tmp_path / "host").output_dir
    _assert_padded(build, caplog)
    _assert_matches_reference(build, "host", threads=(1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_padded_output_channels_compute_the_same_under_qemu(odd_channels_model, tmp_path, profile, caplog):
    """4 NEON lanes: 21 channels become 24, 1001 become 1004."""
    caplog.set_level(logging.INFO, logger="edgepack.schedules")
    build = compile_model(odd_channels_model, profile, tmp_path / profile).output_dir
    _assert_padded(build, caplog)
    _assert_matches_reference(build, "emulator")


@pytest.fixture(scope="module")
def crnn_model(tmp_path_factory):
    return onnx_conv_lstm_classifier(tmp_path_factory.mktemp("crnn") / "crnn.onnx")


def test_a_cnn_with_an_lstm_keeps_its_convolutions_channels_last_and_its_long_rows_in_vectors(crnn_model, tmp_path,
                                                                                            caplog):
    """An LSTM is imported as steps stacked at the end, and TVM's layout inference of a stack failed the
    whole channels-last conversion: every convolution of PP-OCRv2's recogniser ran NCHW (its model 2x
    slower). The classifier's 1001 columns are padded to whole vectors, and the softmax over them sums
    and takes the max in partial results per lane (``rfactor``) rather than in one chain."""
    with caplog.at_level(logging.INFO, logger="edgepack.schedules"):
        build, report = _scheduled_build(crnn_model, "host", tmp_path)
    assert "kept the model's layout" not in caplog.text
    assert "1 depthwise convolution(s) fused into the pointwise convolution after them" in caplog.text
    assert "1 matrix product(s) with columns padded to whole SIMD vectors" in caplog.text
    rules = {f["name"]: f["schedule"] for f in report["functions"]}
    assert [r for name, r in rules.items() if "softmax" in name] == ["cpu.Reduction"], rules
    _assert_matches_reference(build, "host", threads=(1, 2))


def test_long_reductions_are_summed_in_partial_results_per_lane():
    """A row of 1001 (no SIMD width divides it): each lane's partial max and sum over chunks of the row,
    the last chunk guarded, combined at the end; the odd-width exp and division left whole to LLVM's
    vectorizer (vectors of 7 of 16 lanes ran the softmax 0.36 ms, LLVM's own vectors 0.28)."""
    from tvm import s_tir, te, tirx, topi

    x = te.placeholder((1, 40, 1001), name="x")
    sch = s_tir.Schedule(te.create_prim_func([x, topi.nn.fast_softmax(x, 2)]))
    assert Reduction().schedule(sch, CpuInfo("x86_64", 512, 32))
    blocks = {sch.get(b).name_hint: b for b in sch.get_child_blocks(sch.get_sblock("root"))}
    for name in ("T_softmax_maxelem_rf", "T_softmax_expsum_rf"):
        loops = sch.get_loops(blocks[name])
        assert sch.get(loops[0]).kind == tirx.ForKind.PARALLEL
        assert int(sch.get(loops[-1]).extent) == 16 and sch.get(loops[-1]).kind == tirx.ForKind.UNROLLED
    assert not any(sch.get(loop).kind == tirx.ForKind.VECTORIZED for loop in sch.get_loops(blocks["T_softmax_norm"]))


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["rpi4", "rpi3"])
def test_a_cnn_with_an_lstm_computes_the_same_under_qemu(crnn_model, tmp_path, profile):
    build, _ = _scheduled_build(crnn_model, profile, tmp_path)
    _assert_matches_reference(build, "emulator", threads=(None, 2))
