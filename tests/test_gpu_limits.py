"""GPU hardware limits from the profile (``[limits]``), kernels checked against them at compile time, and
GPU runs on this machine in a child process so that a driver's abort becomes an edgepack error (issue 42).

Real builds only: a small matmul + softmax model compiled for profiles derived from the shipped ones with
lower limits; kernels run on PoCL (OpenCL) and lavapipe (Vulkan); the driver abort is PoCL's own
assertion on a kernel whose ``__local`` array is larger than the device's local memory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli
from gpu_common import edit_kernel_text, opencl_driver_missing, vulkan_driver_missing

import edgepack
from edgepack.errors import ProfileError, ValidationError
from edgepack.profiles import LIMIT_KEYS, get_profile, list_profiles, parse_profile
from edgepack.toolchain.packed_kernels import PLAIN_ENV

GPU_PROFILES = ("mali-g610", "mali-g610-vulkan", "adreno-6xx", "android-mali", "x86-64-opencl", "vulkan-generic")


def _matmul_softmax(path: Path) -> Path:
    """A (1, 32, 64) x (64, 64) matmul and a softmax: kernels with workgroup memory (dlight's matmul tiles,
    the softmax's reduction buffer), 256-thread workgroups, 3 storage buffers and a 16 KiB buffer."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Softmax", ["y"], ["z"], axis=-1)],
        "matmul_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 32, 64])], [weights])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _profile(path: Path, base: str, **limits: int) -> str:
    """A profile file: ``base``'s target, host and toolchain, its ``[limits]`` with ``limits`` replaced (the
    target's thread and shared-memory values left to follow them)."""
    p = get_profile(base)
    target = {k: v for k, v in p.target.items() if k not in ("max_num_threads", "max_shared_memory_per_block")}

    def table(values: dict) -> str:
        return "\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items() if v not in (None, False))

    path.write_text(f'name = "{path.stem}"\ndescription = "{base} with other limits"\nbackend = "{p.backend}"\n'
                    f'triple = "{p.triple}"\n\n[target]\n{table(target)}\n\n[limits]\n'
                    f'{table(p.limits.to_dict() | limits)}\n\n[host_target]\n{table(p.host_target or {})}\n\n'
                    f'[toolchain]\n{table(vars(p.toolchain))}\n')
    return str(path)


def _most(build: Path) -> dict[str, int]:
    """The most each limit is asked for by one of the build's kernels."""
    kernels = edgepack.kernels(build).kernels
    return {key: max(k.usage[key] for k in kernels) for key in LIMIT_KEYS}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return _matmul_softmax(tmp_path_factory.mktemp("limits") / "matmul_softmax.onnx")


# ----------------------------------------------------------------------------------------------
# profiles


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_every_gpu_profile_states_its_limits_and_its_target_follows_them(name):
    profile = get_profile(name)
    assert profile.limits is not None and set(profile.limits.to_dict()) - {"fp64"} == set(LIMIT_KEYS), name
    # phones' GPUs have no 64-bit floats (cl_khr_fp64): their float64 operators run on the CPU (test_cpu_fallback)
    assert profile.limits.fp64 is (False if name in ("mali-g610", "android-mali", "adreno-6xx") else None), name
    assert profile.target["max_shared_memory_per_block"] <= profile.limits.workgroup_memory
    assert profile.target["max_num_threads"] <= profile.limits.invocations
    before = profile.source.read_text().split("\n[limits]")[0].splitlines()
    assert before[-1].startswith("#"), f"{name}: no comment says where its limits come from"
    assert edgepack.profiles.profile_from_dict(profile.to_dict()) == profile  # a build records them


def test_cpu_profiles_have_no_gpu_limits():
    assert all(p.limits is None for p in list_profiles() if p.backend == "cpu")


def test_a_malformed_limits_table_is_refused():
    base = {"name": "x", "triple": "x86_64-linux-gnu", "backend": "opencl", "target": {"kind": "opencl"},
            "toolchain": {"cc": "gcc", "cxx": "g++"}}
    with pytest.raises(ProfileError, match="unknown keys storage_bufers"):
        parse_profile(base | {"limits": {"storage_bufers": 8}})
    with pytest.raises(ProfileError, match="not positive integers: workgroup_memory"):
        parse_profile(base | {"limits": {"workgroup_memory": "16k"}})
    with pytest.raises(ProfileError, match="fp64 = 'no', not true or false"):
        parse_profile(base | {"limits": {"fp64": "no"}})
    assert parse_profile(base | {"limits": {"fp64": False}}).limits.fp64 is False
    with pytest.raises(ProfileError, match="max_num_threads = 512, more than its .limits. invocations = 256"):
        parse_profile(base | {"target": {"kind": "opencl", "max_num_threads": 512}, "limits": {"invocations": 256}})
    within = parse_profile(base | {"limits": {"invocations": 128, "workgroup_memory": 8192}})
    assert within.target["max_num_threads"] == 128 and within.target["max_shared_memory_per_block"] == 8192


# ----------------------------------------------------------------------------------------------
# kernels near each limit


@pytest.mark.parametrize(("base", "on"), [("x86-64-opencl", "host-opencl"), ("vulkan-generic", "host-vulkan")])
def test_kernels_at_their_profiles_limits_compile_and_validate(model, tmp_path, base, on):
    """Limits set to exactly what the kernels ask for: every one is met, none exceeded, and the build runs."""
    missing = opencl_driver_missing() if base.endswith("opencl") else vulkan_driver_missing()
    if missing:
        pytest.skip(missing)
    edgepack.compile(model, base, tmp_path / "first")
    most = _most(tmp_path / "first")
    tight = _profile(tmp_path / f"{base}-tight.toml", base, **most)
    build = tmp_path / "tight"
    edgepack.compile(model, tight, build)
    assert _most(build) == most  # at each limit, not over
    report = edgepack.validate(build, on)
    assert report.passed, report.to_dict()


@pytest.mark.parametrize(("limit", "kernel"), [
    ("storage_buffers", "matmul_kernel"),  # 3 buffers: x, w, y
    ("invocations", "softmax_kernel"),  # 256 threads, matmul's 64; no other rule schedules a softmax
    ("buffer_size", "matmul_kernel"),  # the 16 KiB weights
])
def test_a_kernel_one_over_a_limit_is_refused_by_name(model, tmp_path, limit, kernel):
    """The same model for a profile whose limit is one below what a kernel asks: exit 2, the kernel and the
    limit named, nothing written."""
    edgepack.compile(model, "x86-64-opencl", tmp_path / "first")
    most = _most(tmp_path / "first")
    lower = _profile(tmp_path / "lower.toml", "x86-64-opencl", **{limit: most[limit] - 1})
    out = tmp_path / "refused"
    result = run_cli("compile", str(model), "-p", lower, "-o", str(out))
    assert_clean_error(result, f"limit ({most[limit] - 1} ", kernel, f"needs {most[limit]}", code=2)
    assert f"over the profile's {limit} limit" in " ".join(result.stderr.replace("│", " ").split())
    assert not out.exists()


@pytest.mark.parametrize(("base", "on"), [("x86-64-opencl", "host-opencl"), ("vulkan-generic", "host-vulkan")])
def test_a_schedule_over_the_workgroup_memory_is_left_for_a_rule_within_it(model, tmp_path, base, on):
    """One byte less workgroup memory than the kernel that uses the most (on PoCL: the softmax, dlight's
    GeneralReduction with its two reductions' buffers, counted before lowering; on lavapipe: the matmul's
    tiles): the next rule schedules that function within the limit, the build records which rule was over
    and why, and it matches ONNX Runtime."""
    missing = opencl_driver_missing() if base.endswith("opencl") else vulkan_driver_missing()
    if missing:
        pytest.skip(missing)
    edgepack.compile(model, base, tmp_path / "first")
    kernels = edgepack.kernels(tmp_path / "first").kernels
    most = max(kernels, key=lambda k: k.usage["workgroup_memory"])
    used = most.usage["workgroup_memory"]
    first = json.loads((tmp_path / "first" / "manifest.json").read_text())["extra"]
    rule = next(f["schedule"] for g in first.values() if isinstance(g, dict) and "functions" in g
                for f in g["functions"] if f["name"] == most.function)
    lower = _profile(tmp_path / f"{base}-lower.toml", base, workgroup_memory=used - 1)
    build = edgepack.compile(model, lower, tmp_path / "within").output_dir
    assert _most(build)["workgroup_memory"] <= used - 1
    extra = json.loads((build / "manifest.json").read_text())["extra"]
    gpu = next(g for g in extra.values() if isinstance(g, dict) and "functions" in g)
    assert gpu["over_limits"] == {most.function: f"{rule}: {used} bytes of workgroup memory, over the target's "
                                                 f"{used - 1}"}
    assert next(f["schedule"] for f in gpu["functions"] if f["name"] == most.function) != rule
    report = edgepack.validate(build, on)
    assert report.passed, report.to_dict()


# ----------------------------------------------------------------------------------------------
# a driver that aborts


def _with_oversized_local_array(build: Path) -> None:
    """Make one kernel of an OpenCL host build declare a 40 MB ``__local`` array (PoCL has 2 MiB), in the
    kernel source the library carries (same length; ``gpu_common.edit_kernel_text``)."""
    old = b"  __local float x_reindex_shared_ptr[256];"
    new = b"__local int x_reindex_shared_ptr[9999999];"
    assert len(old) == len(new)

    def edit(text: bytes) -> bytes:
        assert text.count(old) == 1, "the matmul kernel's local tile moved"
        return text.replace(old, new)

    edit_kernel_text(build / read_host_library(build), "opencl", edit)


def read_host_library(build: Path) -> str:
    return json.loads((build / "manifest.json").read_text())["artifacts"]["host_library"]["path"]


def test_a_driver_abort_is_an_edgepack_error_and_the_caller_lives_on(model, tmp_path, monkeypatch):
    """PoCL asserts (SIGABRT) in setup_kernel_arg_array_with_locals on a kernel whose local memory exceeds the
    device's, as it did on a text detector's 1.2 MB kernel: validate and bench exit 1 with an edgepack error
    naming the build and the signal, and the Python API raises ValidationError in a process that goes on."""
    if missing := opencl_driver_missing():
        pytest.skip(missing)
    build = tmp_path / "aborts"
    monkeypatch.setenv(PLAIN_ENV, "1")  # the kernel text plain in the library, to edit it
    edgepack.compile(model, "x86-64-opencl", build)
    monkeypatch.delenv(PLAIN_ENV)
    assert edgepack.validate(build, "host-opencl").passed  # the build as compiled runs
    _with_oversized_local_array(build)
    kernel = next(k.name for k in edgepack.kernels(build).kernels if "x_reindex_shared" in k.source)
    function = kernel.removesuffix("_kernel")  # the program's function that launches it

    for command in (("validate", str(build), "--on", "host-opencl"), ("bench", str(build), "--on", "host-opencl")):
        result = run_cli(*command)
        assert_clean_error(result, f"{build}: the OpenCL driver ended the process", "signal SIGABRT",
                           "setup_kernel_arg_array_with_locals", "edgepack inspect BUILD --kernels", code=1)
        # a run names the kernel it was running (the VM calls into Python around each: not timings)
        text = result.stdout + result.stderr
        assert (f"It was running the kernel {function}." in " ".join(text.split())) \
            == (command[0] == "validate"), text

    with pytest.raises(ValidationError, match="signal SIGABRT"):
        edgepack.validate(build, "host-opencl")
    assert os.getpid() and edgepack.kernels(build).kernels  # still here
