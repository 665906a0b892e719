"""64-bit integers on Vulkan (WGSL has none): edgepack.backends.int64 narrows int64 tensors to int32 where
the values provably fit, reads/writes int64 model inputs/outputs as 32-bit words, and refuses by name
what really needs 64 bits. Small ONNX graphs with int64 shape arithmetic, Range, ArgMax, Gather and an
If on an int64 scalar are compiled for vulkan-generic and validated on lavapipe against ONNX Runtime;
Silero VAD (slow) is the real model from the issue.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gpu_common import need_cross_compiler, plugin_with_a_device, tiny_module

from edgepack.backends import get_backend
from edgepack.backends.int64 import Int64Refused, narrow_int64, target_lacks_int64
from edgepack.backends.int64.facts import Fact, exact, join
from edgepack.backends.relax_exprs import is_i64, iter_bindings, op_name
from edgepack.compiling import compile_model
from edgepack.errors import CompileError, EdgepackError
from edgepack.manifest import read_manifest
from edgepack.profiles import get_profile
from edgepack.run.host import run_host_library
from edgepack.validation import validate

PROFILE = "vulkan-generic"
VULKAN = get_backend("vulkan")


# ----------------------------------------------------------------------------------------------
# fixtures and helpers


@pytest.fixture(scope="module")
def lavapipe():
    """The plug-in loaded into this process, a Vulkan adapter behind tvm.device("webgpu", 0)."""
    return plugin_with_a_device("vulkan")


@pytest.fixture(scope="module")
def cross_compiler():
    """vulkan-generic links an aarch64 device library."""
    need_cross_compiler(PROFILE)


def _save(path: Path, nodes, inputs, outputs, initializers=(), opset: int = 17) -> Path:
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _info(name, elem, shape):
    from onnx import helper

    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, array):
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(array), name)


def _compile(model: Path, tmp_path: Path, **shapes) -> Path:
    out = tmp_path / f"{model.stem}-vk"
    compile_model(model, PROFILE, out, input_shapes=shapes or None)
    return out


def _run(build: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The build's host library on lavapipe, outputs as the caller gets them (dtypes included)."""
    import tvm

    return run_host_library(build, read_manifest(build), inputs, tvm.device("webgpu", 0))


def _reference(model: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, inputs)


def _assert_validates(build: Path, inputs=None, seed: int = 3):
    report = validate(build, "host-vulkan", inputs=inputs, seed=seed)
    assert report.passed, report
    return report


def _kernels_have_no_i64(build: Path) -> None:
    source = (build / VULKAN.kernels_source).read_text()
    assert "i64" not in source and "u64" not in source


# ----------------------------------------------------------------------------------------------
# small ONNX graphs, compiled for vulkan-generic and validated on lavapipe


def test_shape_arithmetic_reshape(lavapipe, cross_compiler, tmp_path):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape, plus the shape vector as an int64 output."""
    from onnx import TensorProto as T
    from onnx import helper

    model = _save(tmp_path / "shape_math.onnx", [
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0, name="batch_dim"),
        helper.make_node("Unsqueeze", ["d0", "axes0"], ["d0v"], name="unsqueeze"),
        helper.make_node("Concat", ["d0v", "minus_one"], ["target"], axis=0, name="target_shape"),
        helper.make_node("Reshape", ["x", "target"], ["y"], name="flatten"),
        helper.make_node("Relu", ["y"], ["z"], name="relu"),
    ], [_info("x", T.FLOAT, [2, 3, 4])], [_info("z", T.FLOAT, [2, 12]), _info("target", T.INT64, [2])],
        [_init("zero", np.array(0, np.int64)), _init("axes0", np.array([0], np.int64)),
         _init("minus_one", np.array([-1], np.int64))])
    build = _compile(model, tmp_path)
    _assert_validates(build)
    outputs = _run(build, {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)})
    assert outputs[1].dtype == np.int64 and outputs[1].tolist() == [2, -1]
    assert [o.dtype for o in read_manifest(build).outputs] == ["float32", "int64"]
    _kernels_have_no_i64(build)


def test_argmax_and_range_give_int64_outputs(lavapipe, cross_compiler, tmp_path):
    """ArgMax (int64 by definition) + Range: exact 32-bit values on the GPU, int64 for the caller."""
    from onnx import TensorProto as T
    from onnx import helper

    model = _save(tmp_path / "argmax_range.onnx", [
        helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0, name="argmax"),
        helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="positions"),
        helper.make_node("Add", ["am", "r"], ["y"], name="add_positions"),
        helper.make_node("ArgMin", ["x"], ["amin"], axis=0, keepdims=1, name="argmin"),
    ], [_info("x", T.FLOAT, [4, 10])], [_info("y", T.INT64, [4]), _info("amin", T.INT64, [1, 10])],
        [_init("start", np.array(0, np.int64)), _init("limit", np.array(4, np.int64)),
         _init("delta", np.array(1, np.int64))])
    build = _compile(model, tmp_path)
    _assert_validates(build)
    x = np.random.default_rng(5).standard_normal((4, 10)).astype(np.float32)
    x[2, 3] = x[2, 7] = x[2].max() + 1  # a tie: the first index wins, as in ONNX Runtime
    got, want = _run(build, {"x": x}), _reference(model, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == np.int64 and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    assert read_manifest(build).extra["vulkan"]["cpu_fallback"] == []
    _kernels_have_no_i64(build)


def test_gather_with_int64_indices_from_the_caller(lavapipe, cross_compiler, tmp_path):
    """int64 indices from an input: read as (low, high) words and saturated; negative indices too."""
    from onnx import TensorProto as T
    from onnx import helper

    model = _save(tmp_path / "gather.onnx", [
        helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0, name="lookup"),
        helper.make_node("GatherElements", ["table", "cols"], ["picked"], axis=1, name="pick"),
    ], [_info("table", T.FLOAT, [11, 11]), _info("idx", T.INT64, [3]), _info("cols", T.INT64, [11, 2])],
        [_info("rows", T.FLOAT, [3, 11]), _info("picked", T.FLOAT, [11, 2])])
    build = _compile(model, tmp_path)
    _assert_validates(build)  # random indices 0..10
    rng = np.random.default_rng(1)
    inputs = {"table": rng.standard_normal((11, 11)).astype(np.float32),
              "idx": np.array([-1, -11, 10], np.int64),
              "cols": rng.integers(-11, 11, (11, 2)).astype(np.int64)}
    _assert_validates(build, inputs)
    _kernels_have_no_i64(build)


def test_int64_token_ids_of_a_run_time_length(lavapipe, cross_compiler, tmp_path):
    """A text model's int64 token ids of any length (``--dim T=1..128``): read as (low, high) words of a
    symbolic length and saturated, the whole model on the GPU (before: refused as "an int64 input of dynamic
    shape"); `validate` runs 5 lengths, each matching ONNX Runtime. A wrong build, reading each id's words in
    the other order, fails."""
    from onnx import TensorProto as T
    from onnx import helper

    rng = np.random.default_rng(2)
    model = _save(tmp_path / "tokens.onnx", [
        helper.make_node("Gather", ["E", "ids"], ["e"], axis=0, name="embed"),
        helper.make_node("ReduceMean", ["e"], ["m"], keepdims=0, axes=[1], name="mean"),
    ], [_info("ids", T.INT64, [1, "T"])], [_info("m", T.FLOAT, [1, 8])],
        [_init("E", rng.standard_normal((50, 8)).astype(np.float32))])
    out = tmp_path / "tokens-vk"
    compile_model(model, PROFILE, out, input_shapes={"ids": (1, "T")}, dims=["T=1..128"])
    assert read_manifest(out).extra["vulkan"]["cpu_fallback"] == []
    report = _assert_validates(out)
    assert len(report.sizes) == 5, report
    _assert_validates(out, {"ids": rng.integers(0, 50, (1, 77)).astype(np.int64)})
    _kernels_have_no_i64(out)

    from tvm import relax

    from edgepack.backends.int64 import rewrite

    original = rewrite.Rewriter.saturated

    def swapped(self, value, shape):
        words = relax.op.memory.view(value, relax.ShapeExpr([*shape, 2]), "int32")
        flipped = self.bb.emit(relax.op.flip(words, axis=len(shape)))
        return original(self, self.bb.emit(relax.op.memory.view(flipped, relax.ShapeExpr(list(shape)), "int64")),
                        shape)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rewrite.Rewriter, "saturated", swapped)
        compile_model(model, PROFILE, tmp_path / "wrong", input_shapes={"ids": (1, "T")}, dims=["T=1..128"])
    assert not validate(tmp_path / "wrong", "host-vulkan", seed=3).passed


def test_float_positions_cast_to_int64_indices(lavapipe, cross_compiler, tmp_path):
    """Cast(float -> int64) has no bound, but as Gather indices a clamped 32-bit value selects the same
    rows (an index beyond 32 bits is out of range either way)."""
    from onnx import TensorProto as T
    from onnx import helper

    model = _save(tmp_path / "positions.onnx", [
        helper.make_node("Mul", ["x", "ten"], ["scaled"], name="scale"),
        helper.make_node("Floor", ["scaled"], ["floored"], name="floor"),
        helper.make_node("Cast", ["floored"], ["idx"], to=T.INT64, name="to_index"),
        helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0, name="lookup"),
    ], [_info("x", T.FLOAT, [5]), _info("table", T.FLOAT, [10, 3])], [_info("rows", T.FLOAT, [5, 3])],
        [_init("ten", np.array(10, np.float32))])
    build = _compile(model, tmp_path)
    _assert_validates(build)  # x in [0, 1): indices 0..9
    _kernels_have_no_i64(build)


def test_if_on_an_int64_scalar_input_is_exact_beyond_32_bits(lavapipe, cross_compiler, tmp_path):
    """If(mode == 7) on a 0-d int64 input: both arms stay (run-time condition); the comparison runs on
    the saturated 32-bit value, so 2^32 + 7 (low word 7) still takes the else arm, like ONNX Runtime."""
    from onnx import TensorProto as T
    from onnx import helper

    then_branch = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"], name="times_two")], "then",
                                    [], [_info("t", T.FLOAT, [2, 3])])
    else_branch = helper.make_graph([helper.make_node("Add", ["x", "one"], ["e"], name="plus_one")], "else",
                                    [], [_info("e", T.FLOAT, [2, 3])])
    model = _save(tmp_path / "mode_if.onnx", [
        helper.make_node("Equal", ["mode", "seven"], ["is_seven"], name="is_seven"),
        helper.make_node("If", ["is_seven"], ["y"], then_branch=then_branch, else_branch=else_branch, name="by_mode"),
    ], [_info("x", T.FLOAT, [2, 3]), _info("mode", T.INT64, [])], [_info("y", T.FLOAT, [2, 3])],
        [_init("seven", np.array(7, np.int64)), _init("two", np.array(2, np.float32)),
         _init("one", np.array(1, np.float32))])
    build = _compile(model, tmp_path)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for mode in (7, 3, 2**32 + 7, -(2**32) + 7, 2**63 - 1, -(2**63), 2**31 + 7):
        inputs = {"x": x, "mode": np.array(mode, np.int64)}
        got, want = _run(build, inputs)[0], _reference(model, inputs)[0]
        np.testing.assert_array_equal(got, want, err_msg=f"mode={mode}")
    _assert_validates(build)
    _kernels_have_no_i64(build)


def test_a_constant_beyond_32_bits_is_refused_by_name_or_run_on_the_cpu(lavapipe, cross_compiler, tmp_path):
    from onnx import TensorProto as T
    from onnx import helper

    model = _save(tmp_path / "big_constant.onnx", [
        helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0, name="argmax"),
        helper.make_node("Add", ["am", "big"], ["y"], name="add_big_offset"),
    ], [_info("x", T.FLOAT, [4, 10])], [_info("y", T.INT64, [4])], [_init("big", np.array(3_000_000_000, np.int64))])
    with pytest.raises(CompileError, match="64-bit integers") as err:
        compile_model(model, PROFILE, tmp_path / "big_constant-vk", gpu_only=True)
    message = err.value.message
    assert "add_big_offset" in message and "3000000000" in message and "32 bits" in message, message
    assert "mali-g610" in err.value.hint
    assert not (tmp_path / "big_constant-vk").exists()
    # without --gpu-only: the addition (and the argmax it adds to) on the CPU (tests/test_cpu_fallback.py)
    build = _compile(model, tmp_path)
    assert {op.split(" ")[0] for op in read_manifest(build).extra["vulkan"]["cpu_operators"]} == {
        "add_big_offset", "argmax"}
    _assert_validates(build)


def test_an_int64_output_of_arbitrary_values_is_refused_by_name_or_run_on_the_cpu(lavapipe, cross_compiler,
                                                                                  tmp_path):
    """y = v + 1 for an int64 input v: any int64 value, so the output really needs 64 bits."""
    from onnx import TensorProto as T
    from onnx import helper

    model = _save(tmp_path / "plus_one.onnx", [helper.make_node("Add", ["v", "one"], ["y"], name="plus_one")],
                  [_info("v", T.INT64, [3])], [_info("y", T.INT64, [3])], [_init("one", np.array(1, np.int64))])
    with pytest.raises(CompileError, match="64-bit integers") as err:
        compile_model(model, PROFILE, tmp_path / "refused", gpu_only=True)
    assert "plus_one" in err.value.message and "returns it as int64" in err.value.message
    build = _compile(model, tmp_path)
    _assert_validates(build, {"v": np.array([2**40, -(2**35), 7], np.int64)})


# ----------------------------------------------------------------------------------------------
# the pass on Relax programs (no cross compiler)


def _target():
    import tvm

    return tvm.target.Target(get_profile(PROFILE).target, host={"kind": "llvm"})


def _int64_tensors(mod) -> list[str]:
    from tvm import relax

    found = []
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            found += [b.var.name for b in iter_bindings(func.body) if is_i64(b.var)
                      and not (isinstance(b.value, relax.Call) and op_name(b.value) == "relax.memory.view")]
    return found


def test_static_shape_arithmetic_folds_away():
    """shape_to_tensor / take / where / add / concat / tensor_to_shape on static shapes: constants."""
    from tvm import relax

    R = relax.op

    def f(x):
        s = R.shape_to_tensor(R.shape_of(x))
        d = R.take(s, relax.const(-1, "int64"), axis=0, mode="wrap")
        d = R.where(R.less(d, relax.const(0, "int64")), R.add(d, relax.const(3, "int64")), d)
        target = R.concat([R.expand_dims(d, [0]), relax.const(np.array([6], np.int64), "int64")], axis=0)
        return R.reshape(x, R.tensor_to_shape(target))

    tiny = tiny_module(f, [((2, 3, 4), "float32")])
    narrowed = narrow_int64(tiny.mod)
    assert _int64_tensors(narrowed) == []
    assert [v.value for v in narrowed["main"].ret_ty.shape.values] == [4, 6]


def test_saturation_rules():
    """Which consumers may read a saturated int64 input, and which need the exact value."""
    from tvm import relax

    R = relax.op
    i64 = [((), "int64")]
    ok = [lambda v: R.equal(v, relax.const(16000, "int64")),
          lambda v: R.less(R.add(v, relax.const(5, "int64")), relax.const(0, "int64")),
          lambda v: R.clip(v, 0, 100).astype("float32")]
    for fn in ok:
        narrow_int64(tiny_module(fn, i64).mod)
    refused = {
        "compares a value known only": lambda v: R.equal(v, relax.const(2**31 - 1, "int64")),
        "a cast to float32": lambda v: R.astype(v, "float32"),
        "relax.multiply": lambda v: R.astype(R.multiply(v, relax.const(2, "int64")), "float32"),
        "relax.add may overflow 32 bits": lambda v: R.astype(R.add(v, v), "float32"),
    }
    for needle, fn in refused.items():
        with pytest.raises(Int64Refused, match=needle) as err:
            narrow_int64(tiny_module(fn, i64).mod)
        assert len(err.value.problems) == 1, err.value.problems  # the cause, not its consumers


def test_facts_intervals():
    f = Fact(-10, 10, (-10, 10))
    assert f.covers(0, 5) and not f.covers(0, 11) and not f.covers(-10, 0, strict=True)
    j = join([Fact(0, 5), Fact(-3, 2, (-100, 50))])
    assert (j.lo, j.hi, j.agree) == (-3, 5, (-100, 50))
    assert isinstance(exact(0, 2**31), str)


def test_opencl_keeps_int64():
    """Only targets without 64-bit integers are narrowed."""
    import tvm

    assert target_lacks_int64(_target())
    assert not target_lacks_int64(tvm.target.Target(get_profile("mali-g610").target))


def test_what_the_pass_does_not_cover_is_named_by_kernel():
    """uint64 is not narrowed: with --gpu-only (else it runs on the CPU: test_cpu_fallback) the code generator
    stops, and the error names the fused kernel and its 64-bit buffers instead of TVM's bare 'do not support'."""
    from tvm import relax

    tiny = tiny_module(lambda x: relax.op.add(x, x), [((3,), "uint64")], "u64.onnx")
    with pytest.raises(CompileError, match="64-bit integers") as err:
        VULKAN.build(tiny, _target(), gpu_only=True)
    assert "add (x0 uint64" in err.value.message, err.value.message


def test_relax_take_with_int64_indices_runs_on_lavapipe(lavapipe, tmp_path):
    """What test_vulkan refused before: take with int64 indices from the caller now compiles and
    computes, the indices narrowed on the GPU."""
    import tvm
    from tvm import relax

    tiny = tiny_module(lambda x, i: relax.op.take(x, i, axis=0), [((8, 4), "float32"), ((3,), "int64")], "take.onnx")
    built = VULKAN.build(tiny, _target())
    executable, report = built.executable, built.report
    assert not any("i64" in k.source for k in report.kernels)
    path = tmp_path / "take.so"
    executable.export_library(str(path))
    dev = tvm.device("webgpu", 0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), dev)
    x = np.random.default_rng(2).standard_normal((8, 4)).astype(np.float32)
    idx = np.array([7, 0, 3], np.int64)
    out = vm["main"](tvm.runtime.tensor(x, device=dev), tvm.runtime.tensor(idx, device=dev)).numpy()
    np.testing.assert_array_equal(out, x[idx])


# ----------------------------------------------------------------------------------------------
# the real model: Silero VAD (LSTM, If on the sample rate, int64 shape arithmetic)


def _vad_inputs(samples: int, sr: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input": (rng.standard_normal((1, samples)) * 0.1).astype(np.float32),
            "state": (rng.standard_normal((2, 1, 128)) * 0.5).astype(np.float32),
            "sr": np.array(sr, np.int64)}


@pytest.mark.slow
def test_silero_vad_16k_on_vulkan_matches_onnxruntime(lavapipe, cross_compiler, models, tmp_path):
    """A 16 kHz frame (512 samples + 64 of context). For this length the 8 kHz arm of the If on sr
    cannot run (ONNX Runtime fails in it too), so the build takes the 16 kHz arm: validate with
    sr = 16000 (random inputs give sr in 0..10, which ONNX Runtime rejects for this length)."""
    model = models["silero_vad"]
    build = tmp_path / "vad16k"
    with pytest.warns(UserWarning, match="If_0"):
        compile_model(model.path, PROFILE, build, input_shapes=model.input_shapes)
    manifest = read_manifest(build)
    assert [(t.name, t.dtype, tuple(t.shape)) for t in manifest.inputs] == [
        ("input", "float32", (1, 576)), ("state", "float32", (2, 1, 128)), ("sr", "int64", ())]
    assert manifest.extra["vulkan"]["cpu_fallback"] == []
    _kernels_have_no_i64(build)
    for seed in range(3):
        report = _assert_validates(build, _vad_inputs(576, 16000, seed))
        assert report.reference == "onnxruntime"
    with pytest.raises(EdgepackError, match="rejects these inputs") as err:  # random: sr in 0..10
        validate(build, "host-vulkan")
    assert "--inputs" in err.value.hint


@pytest.mark.slow
def test_silero_vad_8k_keeps_the_if_on_sr(lavapipe, cross_compiler, models, tmp_path):
    """An 8 kHz frame (256 + 32): both arms can run, so the If on sr stays a run-time choice on the
    GPU's 32-bit sr; sr = 2^40 + 16000 (low word 16000) must still take the 8 kHz arm."""
    model = models["silero_vad"]
    build = tmp_path / "vad8k"
    compile_model(model.path, PROFILE, build, input_shapes={"input": (1, 288), "state": (2, 1, 128)})
    _kernels_have_no_i64(build)
    at_16k, at_8k = (_reference(model.path, _vad_inputs(288, sr))[0] for sr in (16000, 8000))
    assert not np.allclose(at_16k, at_8k)  # the arms differ, so the comparisons below mean something
    for sr in (8000, 16000, 2**40 + 16000, -(2**32) + 16000):
        _assert_validates(build, _vad_inputs(288, sr))
    _assert_validates(build)  # random inputs: sr in 0..10 takes the 8 kHz arm in both


def test_topk_of_an_int64_input_is_refused_by_name_not_by_a_traceback(lavapipe, cross_compiler, tmp_path):
    """TopK's values are its input's: an int64 input (any value) returned as they are needs 64 bits. The
    prover gave TopK's int64 values no fact and stopped with an AttributeError (found by the ONNX
    conformance sweep on lavapipe); its indices alone stay narrowable."""
    from onnx import TensorProto as T
    from onnx import helper

    model = _save(tmp_path / "topk_i64.onnx", [helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=0)],
                  [_info("x", T.INT64, [6])], [_info("values", T.INT64, [3]), _info("indices", T.INT64, [3])],
                  [_init("k", np.array([3], np.int64))])
    with pytest.raises(CompileError, match="64-bit integers") as err:
        compile_model(model, PROFILE, tmp_path / "refused", gpu_only=True)
    assert "returns it as int64" in err.value.message, err.value.message
    build = _compile(model, tmp_path)  # without --gpu-only: on the CPU
    _assert_validates(build, {"x": np.array([2**40, -5, 3, 2**33, -(2**41), 0], np.int64)})
