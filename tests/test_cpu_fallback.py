"""What a GPU cannot run exactly runs on the device's CPU, in the same TVM program (``backends/placement.py``).

On Vulkan (WGSL has no 64-bit integers) an int64 value the int64 pass cannot narrow is computed in int64 on the
CPU, with the int64 values it comes from; TVM's scans, wrong in WGSL, run there too. The rest stays on the GPU,
and the values that cross are copied (``R.to_vdevice``). Checked on lavapipe through the Python VM and through
the C runner (the C API, no Python) against ONNX Runtime, with values past 32 bits; ``--gpu-only`` keeps the
refusal by name; a build that reads the CPU's int64 words in the wrong order fails validation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli
from gpu_common import need_cross_compiler, plugin_with_a_device, vulkan_c_runner_outputs
from model_factory import onnx_cumulative, onnx_doubles

from edgepack.backends import get_backend
from edgepack.backends.int64 import rewrite
from edgepack.compiling import compile_model
from edgepack.errors import CompileError
from edgepack.frontends import run_reference
from edgepack.manifest import read_manifest
from edgepack.profiles import get_profile
from edgepack.validation import compare, validate

PROFILE = "vulkan-generic"
VULKAN = get_backend("vulkan")
#: the ONNX nodes of ``_timestamps`` that need 64 bits
CPU_NODES = {"div_ms", "mod_slot", "mod_phase", "cast_phase", "add_class"}


@pytest.fixture(scope="module")
def lavapipe():
    """The plug-in loaded into this process, a Vulkan adapter behind tvm.device("webgpu", 0)."""
    return plugin_with_a_device("vulkan")


@pytest.fixture(scope="module")
def cross_compiler():
    """vulkan-generic links an aarch64 device library."""
    need_cross_compiler(PROFILE)


def _timestamps(path: Path) -> Path:
    """A float network with real (seeded) weights and an int64 timestamp input ``t`` (microseconds, past 2^31):

    - ``slot = t mod 8`` (int64, CPU) picks a row of an embedding, gathered on the GPU (the CPU's int64 read
      there as int32 words); ``phase = float(t mod 5)`` (CPU) scales the features on the GPU;
    - ``y = relu(x W + b) * E[slot] + phase`` (float, GPU);
    - ``t_out = t / 1000 + argmax(y)`` (int64, past 32 bits: the CPU, which needs ``y`` copied back).
    """
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("W", rng.standard_normal((16, 8)).astype(np.float32)), ("b", rng.standard_normal(8).astype(np.float32)),
        ("E", rng.standard_normal((8, 8)).astype(np.float32)), ("thousand", np.array(1000, np.int64)),
        ("eight", np.array(8, np.int64)), ("five", np.array(5, np.int64)), ("axis1", np.array([1], np.int64))]]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"], name="matmul"),
        helper.make_node("Add", ["xw", "b"], ["pre"], name="bias"),
        helper.make_node("Relu", ["pre"], ["h"], name="relu"),
        helper.make_node("Mod", ["t", "eight"], ["slot"], name="mod_slot"),
        helper.make_node("Gather", ["E", "slot"], ["e"], axis=0, name="embed"),
        helper.make_node("Mod", ["t", "five"], ["p64"], name="mod_phase"),
        helper.make_node("Cast", ["p64"], ["p32"], to=T.FLOAT, name="cast_phase"),
        helper.make_node("Unsqueeze", ["p32", "axis1"], ["phase"], name="unsqueeze_phase"),
        helper.make_node("Mul", ["h", "e"], ["he"], name="scale"),
        helper.make_node("Add", ["he", "phase"], ["y"], name="shift"),
        helper.make_node("Div", ["t", "thousand"], ["ms"], name="div_ms"),
        helper.make_node("ArgMax", ["y"], ["cls"], axis=1, keepdims=0, name="argmax"),
        helper.make_node("Add", ["ms", "cls"], ["t_out"], name="add_class"),
    ]
    graph = helper.make_graph(nodes, "timestamps",
                              [helper.make_tensor_value_info("x", T.FLOAT, [2, 16]),
                               helper.make_tensor_value_info("t", T.INT64, [2])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 8]),
                               helper.make_tensor_value_info("t_out", T.INT64, [2])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((2, 16)).astype(np.float32),
            "t": rng.integers(3_000_000_000, 9_000_000_000_000, 2, dtype=np.int64)}  # past 2^31, positive


@pytest.fixture(scope="module")
def timestamps(tmp_path_factory, cross_compiler) -> Path:
    root = tmp_path_factory.mktemp("fallback")
    build = root / "timestamps-vk"
    compile_model(_timestamps(root / "timestamps.onnx"), PROFILE, build)
    return build


def test_int64_operators_run_on_the_cpu_and_the_rest_on_the_gpu(lavapipe, timestamps):
    """The CPU gets the int64 operators, named by ONNX node in the manifest, and (as the argmax's operand) the
    argmax; the float network stays in WGSL with no 64-bit type; the build matches ONNX Runtime with
    timestamps past 2^31 and on random inputs, and its outputs depend on both inputs."""
    extra = read_manifest(timestamps).extra["vulkan"]
    placed = {op.split(" ")[0] for op in extra["cpu_operators"]}
    assert CPU_NODES | {"argmax"} <= placed, extra["cpu_operators"]
    assert not placed & {"matmul", "relu", "embed", "scale", "shift"}, placed
    assert extra["cpu_fallback"] and all("llvm" in f for f in extra["cpu_fallback"])
    shaders = (timestamps / VULKAN.kernels_source).read_text()
    assert "i64" not in shaders and "matmul" in shaders
    reports = [validate(timestamps, "host-vulkan", inputs=_inputs(seed)) for seed in (1, 2)]
    assert all(r.passed for r in reports), reports
    assert validate(timestamps, "host-vulkan", seed=4).passed
    first, second = (run_reference(timestamps / "model.onnx", "onnx", _inputs(s), read_manifest(timestamps).outputs)
                     for s in (1, 2))
    assert not np.allclose(first[0], second[0]) and not np.array_equal(first[1], second[1])


def test_the_c_runner_runs_both_devices_of_the_program(lavapipe, timestamps, tmp_path):
    """No Python: the C API starts the VM on (GPU, CPU), as the AAR and the RPC server do; the outputs (one
    computed on the GPU, one on the CPU) match ONNX Runtime, the int64 one past 32 bits exactly."""
    manifest = read_manifest(timestamps)
    inputs = _inputs(3)
    expected = run_reference(timestamps / "model.onnx", "onnx", inputs, manifest.outputs)
    outputs = vulkan_c_runner_outputs(timestamps, tmp_path, inputs)
    assert compare("y", outputs[0], expected[0], 1e-4, 1e-3).passed
    assert outputs[1].dtype == np.int64 and np.array_equal(outputs[1], expected[1])
    assert expected[1].max() > 2**31


def test_the_device_library_holds_the_cpu_kernels_for_the_device(timestamps):
    """The aarch64 device library carries the CPU's kernels as aarch64 code beside the WGSL."""
    library = timestamps / "device" / "model.so"
    head = library.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 0xB7
    functions = read_manifest(timestamps).extra["vulkan"]["cpu_fallback"]
    assert all(f.encode() in library.read_bytes() for f in functions), functions


def test_words_read_in_the_wrong_order_fail_validation(lavapipe, monkeypatch, tmp_path):
    """A wrong build: the GPU reads the CPU's int64 slot as (high, low) words instead of (low, high): the
    gathered rows differ, and validation says so."""
    original = rewrite.Rewriter.saturated

    def swapped(self, value, shape):
        from tvm import relax

        words = relax.op.memory.view(value, relax.ShapeExpr([*shape, 2]), "int32")
        flipped = self.bb.emit(relax.op.flip(words, axis=len(shape)))
        view = self.bb.emit(relax.op.memory.view(flipped, relax.ShapeExpr(list(shape)), "int64"))
        return original(self, view, shape)

    monkeypatch.setattr(rewrite.Rewriter, "saturated", swapped)
    build = tmp_path / "wrong"
    compile_model(_timestamps(tmp_path / "timestamps.onnx"), PROFILE, build)
    report = validate(build, "host-vulkan", inputs=_inputs(1))
    assert not report.passed and not next(o for o in report.outputs if o.name == "y").passed


def test_gpu_only_refuses_by_name_and_writes_nothing(tmp_path):
    model = _timestamps(tmp_path / "timestamps.onnx")
    with pytest.raises(CompileError, match="64-bit integers") as err:
        compile_model(model, PROFILE, tmp_path / "b", gpu_only=True)
    assert "div_ms" in err.value.message and "--gpu-only" in err.value.hint
    assert not (tmp_path / "b").exists()
    result = run_cli("compile", str(model), "-p", PROFILE, "-o", str(tmp_path / "c"), "--gpu-only")
    assert_clean_error(result, "64-bit integers", "--gpu-only")


def test_the_compile_summary_inspect_and_json_say_what_runs_on_the_cpu(cross_compiler, tmp_path):
    model = _timestamps(tmp_path / "timestamps.onnx")
    text = run_cli("compile", str(model), "-p", PROFILE, "-o", str(tmp_path / "a"), check=True).stdout
    assert "CPU fallback:" in text and "div_ms" in text and "--gpu-only" in text, text
    data = json.loads(run_cli("compile", str(model), "-p", PROFILE, "-o", str(tmp_path / "b"), "--json",
                              check=True).stdout)
    placed = {op.split(" ")[0] for op in data["extra"]["vulkan"]["cpu_operators"]}
    assert CPU_NODES <= placed, data["extra"]["vulkan"]["cpu_operators"]
    shown = run_cli("inspect", str(tmp_path / "a"), check=True).stdout  # inspect BUILD says so too
    assert "on the device's CPU" in shown and "div_ms" in shown, shown
    inspected = json.loads(run_cli("inspect", str(tmp_path / "a"), "--json", check=True).stdout)["build"]
    assert CPU_NODES <= {op.split(" ")[0] for op in inspected["cpu_operators"]}


@pytest.mark.parametrize(("profile", "place", "source"), [("vulkan-generic", "host-vulkan", "f64"),
                                                          ("mali-g610", "host-opencl", "double")])
def test_float64_operators_run_on_the_cpu_where_the_gpu_has_no_64_bit_floats(cross_compiler, tmp_path, profile,
                                                                             place, source):
    """WGSL has no f64, and Mali's OpenCL no cl_khr_fp64 (``[limits] fp64 = false``): the double operators run on
    the CPU, the kernels hold no 64-bit float, and the build matches ONNX Runtime on the GPU of this machine
    (lavapipe, PoCL). With --gpu-only they are refused by ONNX node."""
    plugin_with_a_device(get_backend(get_profile(profile).backend).name)
    model = onnx_doubles(tmp_path / "doubles.onnx")
    build = tmp_path / "b"
    compile_model(model, profile, build)
    extra = read_manifest(build).extra[get_profile(profile).backend]
    placed = {op.split(" ")[0] for op in extra["cpu_operators"]}
    assert placed == {"to_double", "scale_double", "shift_double", "to_float"}, extra["cpu_operators"]
    backend = get_backend(get_profile(profile).backend)
    kernels = (build / backend.kernels_source).read_text()
    assert source not in kernels and "matmul" in kernels
    for seed in (1, 2):
        report = validate(build, place, seed=seed)
        assert report.passed and not report.degenerate, report
    with pytest.raises(CompileError, match="64-bit floats") as err:
        compile_model(model, profile, tmp_path / "refused", gpu_only=True)
    assert "scale_double" in err.value.message and "--gpu-only" in err.value.hint


def test_uint64_operators_run_on_the_cpu_for_vulkan(lavapipe, cross_compiler, tmp_path):
    """uint64 (which the int64 pass does not narrow) on the CPU: a left shift and a comparison of values past
    2^32 match ONNX Runtime on lavapipe (before: TVM's 'CodeGenWebGPU: do not support u64', named by kernel)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper

    nodes = [helper.make_node("BitShift", ["a", "b"], ["shifted"], direction="LEFT", name="shift_u64"),
             helper.make_node("GreaterOrEqual", ["shifted", "a"], ["ge"], name="compare_u64"),
             helper.make_node("Cast", ["ge"], ["y"], to=T.FLOAT, name="to_float")]
    graph = helper.make_graph(nodes, "u64", [helper.make_tensor_value_info("a", T.UINT64, [4]),
                                             helper.make_tensor_value_info("b", T.UINT64, [4])],
                              [helper.make_tensor_value_info("shifted", T.UINT64, [4]),
                               helper.make_tensor_value_info("y", T.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "u64.onnx"))
    build = tmp_path / "b"
    compile_model(tmp_path / "u64.onnx", PROFILE, build)
    assert {op.split(" ")[0] for op in read_manifest(build).extra["vulkan"]["cpu_operators"]} >= {"shift_u64",
                                                                                                  "compare_u64"}
    inputs = {"a": np.array([3, 2**40 + 5, 2**63 + 1, 7], np.uint64), "b": np.array([33, 1, 1, 0], np.uint64)}
    report = validate(build, "host-vulkan", inputs=inputs)
    assert report.passed, report


@pytest.mark.parametrize("backend", ["vulkan", "opencl"])
def test_a_kernel_no_gpu_rule_schedules_runs_on_the_cpu(tmp_path, backend):
    """A kernel (an opaque block) no dlight rule binds to threads: TVM would compile it as host code handed the
    GPU's buffers; edgepack runs it on the CPU, its operand copied there and its result back, and the program
    computes x + 1 on this machine's GPU (lavapipe, PoCL)."""
    import tvm
    from gpu_common import unscheduled_module
    from tvm import relax

    gpu = get_backend(backend)
    plugin_with_a_device(backend)
    profile = get_profile({"vulkan": PROFILE, "opencl": "mali-g610"}[backend])
    built = gpu.build(unscheduled_module(), tvm.target.Target(profile.target, host={"kind": "llvm"}))
    assert built.report.to_dict()["cpu_fallback"] == ["plain_loop"]
    assert not built.report.kernels  # no GPU kernel: the loop is host code
    built.executable.export_library(str(tmp_path / "plain.so"))
    dev = gpu.tvm_device()
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "plain.so")), dev)
    x = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    y = vm["main"](tvm.runtime.tensor(x, device=dev))
    assert y.device.dlpack_device_type() == dev.dlpack_device_type()  # handed back on the GPU
    np.testing.assert_array_equal(y.numpy(), x + 1)


@pytest.mark.parametrize(("op", "dtype"), [("CumSum", np.float32), ("CumProd", np.int32)])
def test_scans_run_on_the_cpu_for_vulkan(lavapipe, cross_compiler, tmp_path, op, dtype):
    """TVM's GPU scans compute wrong in WGSL (``gpu_scans.py``); on the CPU they match ONNX Runtime along 37
    elements; ``--gpu-only`` refuses them by name, as before."""
    model = onnx_cumulative(tmp_path / f"{op}.onnx", op, dtype, exclusive=False)
    build = tmp_path / "b"
    compile_model(model, PROFILE, build)
    assert any("cumulative" in why for why in read_manifest(build).extra["vulkan"]["cpu_operators"].values())
    rng = np.random.default_rng(1)
    x = (rng.uniform(0.9, 1.1, (3, 37)) if dtype == np.float32 else rng.integers(-1, 2, (3, 37))).astype(dtype)
    report = validate(build, "host-vulkan", inputs={"x": x})
    assert report.passed, report
    with pytest.raises(CompileError, match="cumulative") as err:
        compile_model(model, PROFILE, tmp_path / "refused", gpu_only=True)
    assert f"{op}.onnx" in err.value.message and "mali-g610" in err.value.hint


@pytest.mark.slow
def test_silero_vad_opset_15_runs_on_vulkan_with_its_int64_on_the_cpu(lavapipe, cross_compiler, models, tmp_path):
    """A 16 kHz frame (512 samples and 64 of context). Silero VAD's 16 kHz opset-15 export keeps its sample rate in ``stateN`` through ``sr * 0`` cast to float
    ("/Mul", "/Cast"), which the int64 pass cannot narrow (an int64 input times a constant): refused for Vulkan
    before, now those two run on the CPU and the LSTM on the GPU; on lavapipe it matches ONNX Runtime through
    the Python VM and the C runner."""
    model = models["silero_vad_16k_op15"]
    build = tmp_path / "vad"
    compile_model(model.path, PROFILE, build, input_shapes=model.input_shapes)
    manifest = read_manifest(build)
    placed = manifest.extra["vulkan"]["cpu_operators"]
    assert {op.split(" ")[0] for op in placed} == {"/Mul", "/Cast"}, placed
    for seed in range(2):
        rng = np.random.default_rng(seed)
        inputs = {"input": (rng.standard_normal((1, 576)) * 0.1).astype(np.float32),
                  "state": (rng.standard_normal((2, 1, 128)) * 0.5).astype(np.float32), "sr": np.array(16000, np.int64)}
        report = validate(build, "host-vulkan", inputs=inputs)
        assert report.passed and report.reference == "onnxruntime", report
    expected = run_reference(build / manifest.model_file, "onnx", inputs, manifest.outputs)
    outputs = vulkan_c_runner_outputs(build, tmp_path, inputs)
    for spec, actual, want in zip(manifest.outputs, outputs, expected):
        assert compare(spec.name, actual, want, 1e-4, 1e-3).passed, spec.name


def test_a_static_c_bundle_runs_both_devices_of_the_program(tmp_path):
    """No Python, no dlopen: the static runner of a C bundle (the program's CPU kernels and the OpenCL plug-in
    linked in) on this machine's OpenCL device, for a profile without 64-bit floats (x86-64-opencl with
    ``[limits] fp64 = false``, a profile file): the doubles on the CPU, the product on PoCL, as ONNX Runtime."""
    from edgepack.packaging.c import package_c, run_bundle

    plugin_with_a_device("opencl")
    text = (Path(__file__).resolve().parent.parent / "device_profiles" / "x86-64-opencl.toml").read_text()
    assert "buffer_size = 134217728\n" in text
    profile = tmp_path / "no-fp64.toml"
    profile.write_text(text.replace('name = "x86-64-opencl"', 'name = "x86-64-opencl-no-fp64"')
                       .replace("buffer_size = 134217728\n", "buffer_size = 134217728\nfp64 = false\n"))
    model = onnx_doubles(tmp_path / "doubles.onnx")
    build = compile_model(model, str(profile), tmp_path / "b").output_dir
    assert read_manifest(build).extra["opencl"]["cpu_operators"]
    bundle = package_c(build, tmp_path / "c")
    x = np.random.default_rng(4).standard_normal((2, 16)).astype(np.float32)
    expected = run_reference(model, "onnx", {"x": x}, read_manifest(build).outputs)
    for static in (True, False):
        outputs = run_bundle(bundle.output_dir, {"x": x}, emulate=False, static=static).outputs
        assert compare("y", outputs[0], expected[0], 1e-4, 1e-3).passed, static


# ----------------------------------------------------------------------------------------------
# operators of a data-dependent shape (NonZero, Unique) and NMS: TVM runs them on the CPU


def _masked_rows(path: Path) -> Path:
    """A float network with real (seeded) weights whose output's shape depends on its input: ``h = x W``
    (GPU), ``idx = NonZero(h > 0)`` (the CPU: TVM's runtime function), the positive values gathered by
    ``idx`` and doubled (GPU), and ``idx`` itself (int64) out."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(9)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 12)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(2, np.float32), "two")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
             helper.make_node("Greater", ["h", "zero"], ["positive"], name="positive"),
             helper.make_node("NonZero", ["positive"], ["idx"], name="nonzero"),
             helper.make_node("Transpose", ["idx"], ["at"], perm=[1, 0], name="transpose"),
             helper.make_node("GatherND", ["h", "at"], ["values"], name="gather"),
             helper.make_node("Mul", ["values", "two"], ["doubled"], name="double")]
    graph = helper.make_graph(nodes, "masked_rows", [helper.make_tensor_value_info("x", T.FLOAT, [6, 16])],
                              [helper.make_tensor_value_info("doubled", T.FLOAT, [None]),
                               helper.make_tensor_value_info("idx", T.INT64, [2, None])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize(("profile", "place"), [("vulkan-generic", "host-vulkan"), ("mali-g610", "host-opencl")])
def test_nonzero_runs_on_the_cpu_between_gpu_kernels(cross_compiler, tmp_path, profile, place):
    """TVM's NonZero is a runtime function that reads its operand as host memory: on a GPU build it read the
    GPU's buffer (PoCL's is host memory, so it passed there by chance; a phone's driver would crash, as the
    mask of a real GPU does). It now runs on the CPU, the matrix product and the gather on the GPU (on Vulkan
    the comparison whose mask it reads runs on the CPU too: WGSL has no bool buffers; the gather reads its int64
    indices as words of a run-time length, saturated), and the outputs, of a shape that
    depends on the input, match ONNX Runtime on this machine's GPU for several inputs. --gpu-only refuses it
    by ONNX node."""
    backend = get_backend(get_profile(profile).backend)
    plugin_with_a_device(backend.name)
    model = _masked_rows(tmp_path / "masked.onnx")
    build = tmp_path / "b"
    compile_model(model, profile, build)
    placed = {op.split(" ")[0] for op in read_manifest(build).extra[get_profile(profile).backend]["cpu_operators"]}
    assert "nonzero" in placed and "matmul" not in placed and "gather" not in placed, placed
    sizes = set()
    for seed in (0, 1, 2):
        report = validate(build, place, seed=seed)
        assert report.passed and not report.degenerate, report
        sizes.add(tuple(report.outputs[1].shape))
    assert len(sizes) > 1, sizes  # the inputs gave outputs of different shapes
    with pytest.raises(CompileError, match="depends on the values") as err:
        compile_model(model, profile, tmp_path / "refused", gpu_only=True)
    assert "nonzero" in err.value.message and "--gpu-only" in err.value.hint


def test_nonzero_in_the_c_runner_on_vulkan(lavapipe, cross_compiler, tmp_path):
    """The C API's own NonZero (``ep_run_nonzero``, no Python) on the CPU side of a Vulkan build: the C runner's
    outputs match ONNX Runtime on lavapipe."""
    model = _masked_rows(tmp_path / "masked.onnx")
    build = tmp_path / "b"
    compile_model(model, PROFILE, build)
    manifest = read_manifest(build)
    x = np.random.default_rng(4).standard_normal((6, 16)).astype(np.float32)
    expected = run_reference(model, manifest.model_format, {"x": x}, manifest.outputs)
    actual = vulkan_c_runner_outputs(build, tmp_path / "c", {"x": x})
    for spec, got, want in zip(manifest.outputs, actual, expected):
        assert got.shape == want.shape, spec.name
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=spec.name)


def _nms(path: Path) -> Path:
    """ONNX NonMaxSuppression of 2 classes over 10 boxes, at most 3 boxes per class, the boxes made by a
    seeded linear layer from the input (so they depend on it); its selected indices (int64) out."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.uniform(0, 1, (4, 4)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array([3], np.int64), "max_boxes"),
             numpy_helper.from_array(np.array([0.3], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.2], np.float32), "min_score")]
    nodes = [helper.make_node("MatMul", ["corners", "W"], ["boxes"], name="boxes"),
             helper.make_node("Sigmoid", ["logits"], ["scores"], name="scores"),
             helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou", "min_score"], ["selected"],
                              name="nms")]
    graph = helper.make_graph(nodes, "nms", [helper.make_tensor_value_info("corners", T.FLOAT, [1, 10, 4]),
                                             helper.make_tensor_value_info("logits", T.FLOAT, [1, 2, 10])],
                              [helper.make_tensor_value_info("selected", T.INT64, [None, 3])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_nms_runs_on_the_cpu_for_vulkan(lavapipe, cross_compiler, monkeypatch, tmp_path):
    """TVM's NMS kernel computes in int64 inside (WGSL has none: it was refused naming that kernel): it runs on
    the CPU with the small kernels its legalisation makes, the boxes on the GPU, and its selection matches
    ONNX Runtime on lavapipe. A wrong build fails: copying its constant operands to the CPU before
    legalisation (as the placement first did) hides the maximum box count from TVM's legaliser, which then
    keeps every box."""
    import tvm
    from tvm import relax

    from edgepack.backends import placement

    model = _nms(tmp_path / "nms.onnx")
    build = tmp_path / "b"
    compile_model(model, PROFILE, build)
    assert "nms" in {op.split(" ")[0] for op in read_manifest(build).extra["vulkan"]["cpu_operators"]}
    for seed in (0, 1):
        report = validate(build, "host-vulkan", seed=seed)
        assert report.passed and report.outputs[0].shape[0] > 0, report

    on = placement._Placer.on

    def copied_first(self, expr, side):
        new = on(self, expr, side)
        if side == "cpu" and isinstance(new, tvm.ir.GenericConst):
            return self.bb.emit(relax.op.to_vdevice(new, self.cpu))
        return new

    monkeypatch.setattr(placement._Placer, "on", copied_first)
    compile_model(model, PROFILE, tmp_path / "wrong")
    report = validate(tmp_path / "wrong", "host-vulkan", seed=0)
    assert not report.passed, report


@pytest.mark.parametrize("case", ["test_tril", "test_triu_square"])
def test_values_the_gpu_makes_for_the_cpu_are_copied_there(lavapipe, cross_compiler, tmp_path, case):
    """ONNX's Trilu cases on int64 data: the int64 ``where`` runs on the CPU, and its mask (a bool constant,
    which the bool widening casts back to bool right before its reader, after the placement) was a GPU kernel
    the CPU kernel read without a copy, a wrong mask (7-9 off on lavapipe). It now runs on the CPU
    (``legalized_on_cpu``), and any value the GPU makes that a CPU kernel reads is copied: the suite's expected
    output, exactly."""
    import onnx
    from onnx import numpy_helper

    data = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node" / case
    build = tmp_path / "b"
    compile_model(data / "model.onnx", PROFILE, build)
    x = numpy_helper.to_array(onnx.load_tensor(str(data / "test_data_set_0" / "input_0.pb")))
    expected = numpy_helper.to_array(onnx.load_tensor(str(data / "test_data_set_0" / "output_0.pb")))
    name = read_manifest(build).inputs[0].name
    report = validate(build, "host-vulkan", inputs={name: x})
    assert report.passed and report.outputs[0].max_abs_error == 0, report
    np.testing.assert_array_equal(run_reference(data / "model.onnx", "onnx", {name: x},
                                                read_manifest(build).outputs)[0], expected)
