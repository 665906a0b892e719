"""scripts/kernel_profile.py: a real host build's kernels timed inside the model (no assertion on time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kernel_profile
import pytest
from model_factory import onnx_depthwise_pointwise

from edgepack.compiling import compile_model
from edgepack.run.threads import resolve_threads

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "kernel_profile.py"


@pytest.fixture(scope="module")
def host_build(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("kernel_profile")
    return compile_model(onnx_depthwise_pointwise(work / "dwpw.onnx"), "host", work / "build").output_dir


def test_every_kernel_call_of_the_model_is_timed(host_build):
    import tvm

    from edgepack.manifest import read_manifest
    from edgepack.run.host import load_host_library
    from edgepack.tensors import random_inputs

    manifest = read_manifest(host_build)
    vm = load_host_library(host_build / manifest.artifacts["host_library"].path, tvm.cpu())
    args = [tvm.runtime.tensor(v) for v in random_inputs(manifest.inputs, 0).values()]
    calls = kernel_profile.record_calls(vm, args)
    assert calls and not any(name.startswith("vm.builtin.") for name, _f, _a in calls)

    flops = kernel_profile.kernel_flops(host_build, manifest)
    result = kernel_profile.profile_build(host_build, resolve_threads(None), runs=3, warmup=1, flops=flops)
    assert sum(k.calls for k in result.kernels) == len(calls)
    assert {k.name for k in result.kernels} == {name for name, _f, _a in calls}
    assert sum(k.share for k in result.kernels) == pytest.approx(1.0)
    assert all(k.ms > 0 for k in result.kernels)
    fused = [k for k in result.kernels if "conv2d" in k.name]  # the convolutions have FLOP counts
    assert fused and all(k.gflops is not None and k.gflops > 0 for k in fused)


def test_the_script_prints_json_for_a_build(host_build):
    result = subprocess.run([sys.executable, str(SCRIPT), str(host_build), "--threads", "1", "--runs", "2",
                             "--no-flops", "--json"], check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["threads"] == 1 and data["runs"] == 2 and data["kernels"]
    assert all(k["gflops"] is None for k in data["kernels"])


def test_a_directory_that_is_not_a_build_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        kernel_profile.main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "not a build directory" in capsys.readouterr().err
