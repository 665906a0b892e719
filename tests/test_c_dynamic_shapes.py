"""Dynamic input dimensions at the C API: metadata version 2, ep_model_input_dim, ep_model_set_input_typed
at any size in a dimension's range, ep_model_output_shape, and the example runner on such a model.

The model is built directly with TVM (no frontend): ``main(x: (2, W), y: (2, W))`` returning
``a = x * 2 + y`` (shape (2, W)) and ``b = concat([x, y], axis=1)`` (shape (2, 2W)), W = 8..64 step 4.
It runs with the installed wheel's runtime on this machine (also under ASan/UBSan) and under qemu for
aarch64 with the official aarch64 runtime.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgepack.errors import EdgepackError
from edgepack.toolchain.c_programs import build_c_program
from edgepack.toolchain.compilers import DEFAULT_TARGET_FLAGS
from edgepack.toolchain.model_library import (
    export_model_shared,
    model_meta_text,
    parse_model_meta,
    parse_model_meta_dims,
    write_model_meta,
)
from edgepack.toolchain.sources import C_API, source_dir
from edgepack.toolchain.tvm_runtime import ensure_target_runtime, host_runtime

HOST = "x86_64-linux-gnu"
AARCH64 = "aarch64-linux-gnu"
TARGETS = {
    HOST: {"kind": "llvm"},
    AARCH64: {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]},
}
COMPILERS = {HOST: ("gcc", "g++"), AARCH64: ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++")}
QEMU_AARCH64 = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"]

W_MIN, W_MAX, W_STEP = 8, 64, 4
INPUTS = [("x", "float32", (2, "W")), ("y", "float32", (2, "W"))]
OUTPUTS = [("a", "float32", (2, "?")), ("b", "float32", (2, "?"))]
DIMS = {"W": (W_MIN, W_MAX, W_STEP)}
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]


def _needs(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")


def _run(cmd, *, check=True, env=None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, env=env,
                            check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def _build_model(triple: str, out: Path) -> Path:
    """The tiny model with a symbolic W, compiled for ``triple``, metadata embedded."""
    import tvm
    from model_factory import relax_tiny_dynamic

    executable = tvm.compile(relax_tiny_dynamic(), target=tvm.target.Target(TARGETS[triple]))
    cc, cxx = COMPILERS[triple]
    return export_model_shared(executable, out / "model.so", cxx, cc=cc,
                               meta_text=model_meta_text(INPUTS, OUTPUTS, DIMS),
                               options=list(DEFAULT_TARGET_FLAGS.get(triple, ())))


def _inputs(d: Path, w: int, seed: int) -> tuple[Path, Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, w)).astype(np.float32)
    y = rng.standard_normal((2, w)).astype(np.float32)
    np.save(d / f"x{w}.npy", x)
    np.save(d / f"y{w}.npy", y)
    return d / f"x{w}.npy", d / f"y{w}.npy", x, y


def _check_runner_at(runner_cmd: list, lib: Path, d: Path, w: int, seed: int) -> None:
    """The runner at width w: the produced shapes in its lines and .npy files, values as numpy's."""
    xp, yp, x, y = _inputs(d, w, seed)
    out = d / f"out{w}"
    result = _run([*runner_cmd, lib, "--input", f"x={xp}", "--input", f"y={yp}", "--output-dir", out])
    lines = result.stdout.splitlines()
    assert any(line.startswith(f"output 0 a float32 [2,{w}] ") for line in lines), result.stdout
    assert any(line.startswith(f"output 1 b float32 [2,{2 * w}] ") for line in lines), result.stdout
    a, b = np.load(out / "0_a.npy"), np.load(out / "1_b.npy")
    assert a.shape == (2, w) and b.shape == (2, 2 * w)
    np.testing.assert_allclose(a, x * 2 + y, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(b, np.concatenate([x, y], axis=1))


@pytest.fixture(scope="module")
def host_model(tmp_path_factory) -> Path:
    _needs("gcc", "g++")
    return _build_model(HOST, tmp_path_factory.mktemp("dyn-host"))


# ---------------------------------------------------------------------------------------------
# metadata text (Python)


def test_meta_text_version_2():
    text = model_meta_text(INPUTS, OUTPUTS, DIMS)
    assert text == ("edgepack-model-meta 2\ndim W 8 64 4\ninput x float32 2,W\ninput y float32 2,W\n"
                    "output a float32 2,?\noutput b float32 2,?\n")
    inputs, outputs = parse_model_meta(text)
    assert [t.shape for t in inputs] == [(2, "W"), (2, "W")] and outputs[1].shape == (2, "?")
    assert parse_model_meta_dims(text) == DIMS
    # without dims: version 1, byte for byte as before
    static = model_meta_text([("x", "float32", (2, 8))], [("a", "float32", (2, "?"))])
    assert static == "edgepack-model-meta 1\ninput x float32 2,8\noutput a float32 2,?\n"
    assert model_meta_text([("x", "float32", (2, 8))], [("a", "float32", (2, 8))], {}) == \
        "edgepack-model-meta 1\ninput x float32 2,8\noutput a float32 2,8\n"
    assert parse_model_meta_dims(static) == {}


def test_meta_text_write_with_dims(tmp_path):
    path = write_model_meta(tmp_path / "model.meta", INPUTS, OUTPUTS, DIMS)
    assert path.read_text() == model_meta_text(INPUTS, OUTPUTS, DIMS)


@pytest.mark.parametrize("inputs, outputs, dims, match", [
    ([("x", "float32", (2, "H"))], OUTPUTS, DIMS, "dynamic or invalid shape"),   # H not declared
    (INPUTS, OUTPUTS, None, "dynamic or invalid shape"),                         # no dims at all
    ([("x", "float32", (2, "?"))], OUTPUTS, DIMS, "dynamic or invalid shape"),   # '?' input
    (INPUTS, [("a", "float32", (2, "W"))], DIMS, "dynamic or invalid shape"),   # a name in an output
    (INPUTS, OUTPUTS, {"W": (8, 66, 4)}, "multiple"),                            # off the step
    (INPUTS, OUTPUTS, {"W": (0, 64, 4)}, "1 <= min <= max"),
    (INPUTS, OUTPUTS, {"W": (9, 8, 1)}, "1 <= min <= max"),
    (INPUTS, OUTPUTS, {"W": (8, 64, 0)}, "step"),
    (INPUTS, OUTPUTS, {"W": (8, 64)}, "min, max, step"),
    (INPUTS, OUTPUTS, {"W": (8.0, 64, 4)}, "integers"),
    (INPUTS, OUTPUTS, {"W": (True, 64, 1)}, "integers"),
    ([("x", "float32", (2, "9W"))], OUTPUTS, {"9W": (8, 64, 4)}, "identifier"),
    ([("x", "float32", (2, "W-1"))], OUTPUTS, {"W-1": (8, 64, 4)}, "identifier"),
])
def test_meta_text_rejects(inputs, outputs, dims, match):
    with pytest.raises(EdgepackError, match=match) as err:
        model_meta_text(inputs, outputs, dims)
    assert err.value.hint


# ---------------------------------------------------------------------------------------------
# host: the C test program and the example runner


def test_host_c_api_dynamic(tmp_path, host_model):
    """runtimes/api/c/tests/test_dynamic.c, warning-free, against the wheel's runtime."""
    test = build_c_program(host_runtime(), tmp_path / "test_dynamic", cc="gcc", werror=True,
                           source=source_dir(C_API) / "tests" / "test_dynamic.c")
    (tmp_path / "work").mkdir()
    result = _run([test, host_model, tmp_path / "work"], check=False)
    assert result.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed"), result.stdout + result.stderr
    assert result.returncode == 0


def _sanitizers_usable(tmp_path: Path) -> None:
    """Skip when ASan cannot run here for a reason outside the code (no ptrace for LeakSanitizer,
    an ASLR setting ASan rejects): a trivial program built the same way must run."""
    src = tmp_path / "probe.c"
    src.write_text("#include <stdlib.h>\nint main(void) { void* p = malloc(8); free(p); return 0; }\n")
    exe = tmp_path / "probe"
    built = _run(["gcc", *SANITIZE, src, "-o", exe], check=False)
    if built.returncode != 0:
        pytest.skip(f"gcc cannot build with -fsanitize=address,undefined here: {built.stderr.strip()[-300:]}")
    ran = _run([exe], check=False)
    if ran.returncode != 0:
        pytest.skip("AddressSanitizer cannot run in this environment (ptrace/ASLR restrictions?): "
                    f"{ran.stderr.strip()[-300:]}")


def test_host_c_api_dynamic_sanitized(tmp_path, host_model):
    """test_dynamic.c and the runner built with -fsanitize=address,undefined (leak checks on)."""
    _sanitizers_usable(tmp_path)
    rt = host_runtime()
    flags = [*rt.cflags, *SANITIZE]  # cflags replaces the defaults: keep them
    test = build_c_program(rt, tmp_path / "test_dynamic_asan", cc="gcc", werror=True, cflags=flags,
                           source=source_dir(C_API) / "tests" / "test_dynamic.c")
    (tmp_path / "work").mkdir()
    result = _run([test, host_model, tmp_path / "work"], check=False)
    assert result.stdout.strip().splitlines()[-1].endswith(" passed, 0 failed"), result.stdout + result.stderr
    assert result.returncode == 0, result.stderr
    assert "Sanitizer" not in result.stderr and "runtime error" not in result.stderr, result.stderr

    runner = build_c_program(rt, tmp_path / "edgepack_run_asan", cc="gcc", werror=True, cflags=flags)
    for w, seed in ((W_MIN, 1), (28, 2), (W_MAX, 3)):
        _check_runner_at([runner], host_model, tmp_path, w, seed)
    result = _run([runner, host_model, "--input", f"x={_inputs(tmp_path, 30, 4)[0]}"], check=False)
    assert result.returncode == 1 and "EP_ERR_SHAPE" in result.stderr
    assert "Sanitizer" not in result.stderr and "runtime error" not in result.stderr, result.stderr


def test_host_runner_dynamic(tmp_path, host_model):
    """The example runner: several widths from .npy files, readable refusals, --info, zeros at min."""
    runner = build_c_program(host_runtime(), tmp_path / "edgepack_run", cc="gcc", werror=True)
    for w, seed in ((W_MIN, 1), (20, 2), (W_MAX, 3)):
        _check_runner_at([runner], host_model, tmp_path, w, seed)

    info = _run([runner, host_model, "--info"]).stdout.splitlines()
    assert info[:2] == ["input 0 x float32 [2,W=8..64:4]", "input 1 y float32 [2,W=8..64:4]"]

    # off the step and out of range: exit 1, EP_ERR_SHAPE, W and its range named
    for w in (22, 68, 4):
        xp, yp, _, _ = _inputs(tmp_path, w, 5)
        result = _run([runner, host_model, "--input", f"x={xp}", "--input", f"y={yp}"], check=False)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "EP_ERR_SHAPE" in result.stderr
        assert f"(W) is {w}; the model takes W from 8 to 64 in steps of 4" in result.stderr, result.stderr
    # x and y disagree on W
    x12, _, _, _ = _inputs(tmp_path, 12, 6)
    _, y16, _, _ = _inputs(tmp_path, 16, 7)
    result = _run([runner, host_model, "--input", f"x={x12}", "--input", f"y={y16}"], check=False)
    assert result.returncode == 1 and "EP_ERR_SHAPE" in result.stderr
    assert "dimension W is 12 in input 0 'x'" in result.stderr and "16 in input 1 'y'" in result.stderr
    # raw bytes do not state W
    raw = tmp_path / "x.bin"
    raw.write_bytes(np.zeros((2, 8), np.float32).tobytes())
    result = _run([runner, host_model, "--input", f"x={raw}"], check=False)
    assert result.returncode == 1 and "EP_ERR_SHAPE" in result.stderr and "dynamic dimensions (W)" in result.stderr
    # inputs not given: zeros at W's min, or at the W another input gave
    result = _run([runner, host_model])
    assert "using zeros of shape [2,8]" in result.stderr
    assert any(line.startswith("output 1 b float32 [2,16] ") for line in result.stdout.splitlines())
    x40, _, _, _ = _inputs(tmp_path, 40, 8)
    result = _run([runner, host_model, "--input", f"x={x40}"])
    assert "input y not given, using zeros of shape [2,40]" in result.stderr
    assert any(line.startswith("output 1 b float32 [2,80] ") for line in result.stdout.splitlines())


# ---------------------------------------------------------------------------------------------
# aarch64 under qemu


def test_aarch64_runner_dynamic_under_qemu(tmp_path):
    """The same model built for aarch64, the shared runner over the official aarch64 runtime, two widths."""
    cc, cxx = COMPILERS[AARCH64]
    _needs(cc, cxx, QEMU_AARCH64[0])
    from edgepack.paths import cache_root

    rt = ensure_target_runtime(AARCH64, cc, cxx, cache_dir=cache_root(), need_static=False)
    lib = _build_model(AARCH64, tmp_path)
    runner = build_c_program(rt, tmp_path / "edgepack_run", cc=cc, werror=True)
    for w, seed in ((12, 1), (W_MAX, 2)):
        _check_runner_at([*QEMU_AARCH64, runner], lib, tmp_path, w, seed)
    result = _run([*QEMU_AARCH64, runner, lib, "--input", f"x={_inputs(tmp_path, 10, 3)[0]}"], check=False)
    assert result.returncode == 1 and "the model takes W from 8 to 64 in steps of 4" in result.stderr
