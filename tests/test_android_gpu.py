"""An AAR of a GPU build carries the backend's runtime plug-in for each ABI, and its Java class puts the
plug-in beside the model library (where the C API loads it from).

No Android NDK is reachable here, so ``package android`` runs, end to end, with a stand-in "NDK": its
``aarch64-linux-android24-clang`` is Debian's aarch64 cross compiler (C++ runtime linked in statically)
whose shared libraries get bionic's names for the C library (``libc.so.6`` -> ``libc.so`` ...). The result
cannot run on a phone (glibc, not bionic), but every step of the real code path runs (the TVM runtime,
JNI layer, model and OpenCL plug-in built for the ABI, ELF checks of each library and of what it needs,
the AAR and Gradle module), which is what this checks, structurally, as the other AAR tests do: which
libraries each ABI directory holds, and for which machine they were built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edgepack.paths import cache_root

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EM_AARCH64 = 183
NDK_VARS = ("ANDROID_NDK_HOME", "ANDROID_NDK_ROOT", "TVM_NDK_CC")
CROSS_LIBS = Path("/usr/aarch64-linux-gnu/lib")


# The stand-in clang: the cross compiler, then bionic's library names in what a shared library needs (the
# names are shorter, so they are rewritten in place in .dynstr).
WRAPPER = """#!{python}
import subprocess, sys
args = sys.argv[1:]
shared = "-shared" in args
extra = ["-static-libstdc++", "-static-libgcc"] if shared else []
code = subprocess.call(["{real}", *{includes!r}, *args, *extra])
if code or not shared or "-o" not in args:
    sys.exit(code)
out = args[args.index("-o") + 1]
renames = {{b"libc.so.6": b"libc.so", b"libm.so.6": b"libm.so", b"libdl.so.2": b"libdl.so",
            b"libpthread.so.0": b"libc.so", b"ld-linux-aarch64.so.1": b"libdl.so"}}
data = bytearray(open(out, "rb").read())
for old, new in renames.items():
    at = data.find(b"\\0" + old + b"\\0")
    while at >= 0:
        data[at + 1:at + 1 + len(old)] = new + b"\\0" * (len(old) - len(new))
        at = data.find(b"\\0" + old + b"\\0", at + 1)
open(out, "wb").write(bytes(data))
"""


def _java_home() -> Path | None:
    javac = shutil.which("javac")
    return Path(os.path.realpath(javac)).parent.parent if javac else None


@pytest.fixture(scope="module")
def stand_in_ndk() -> Path:
    """``<cache>/test-ndk-stand-in``: a stable path, so the runtime and plug-in built with it stay cached."""
    java_home = _java_home()
    if shutil.which("aarch64-linux-gnu-gcc") is None or java_home is None or not CROSS_LIBS.is_dir():
        pytest.skip("needs the aarch64 cross compiler and a JDK")
    root = cache_root() / "test-ndk-stand-in"
    bin_dir = root / "toolchains" / "llvm" / "prebuilt" / "linux-x86_64" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{java_home / 'include'}", f"-I{java_home / 'include' / 'linux'}"]  # the NDK sysroot has jni.h
    for name, real in (("aarch64-linux-android24-clang", "aarch64-linux-gnu-gcc"),
                       ("aarch64-linux-android24-clang++", "aarch64-linux-gnu-g++")):
        wrapper = bin_dir / name
        text = WRAPPER.format(python=sys.executable, real=real, includes=includes)
        if not wrapper.is_file() or wrapper.read_text() != text:
            wrapper.write_text(text)
            wrapper.chmod(0o755)
    return root


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in NDK_VARS} | {"COLUMNS": "200"}
    result = subprocess.run([sys.executable, "-m", "edgepack", *args], capture_output=True, text=True, env=env,
                            timeout=1800, cwd=ROOT, check=False)
    assert result.returncode == 0, f"edgepack {' '.join(args)}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@pytest.mark.parametrize("profile", ["adreno-6xx", "android-mali"])
def test_opencl_aar_carries_the_plugin_for_each_abi(profile, stand_in_ndk, models, tmp_path):
    model = models["ppocr_cls"]
    shape = [a for name, dims in model.input_shapes.items() for a in ("--input-shape", f"{name}:{','.join(map(str, dims))}")]
    build = tmp_path / "build"
    _cli("compile", str(model.path), "--profile", profile, "--ndk", str(stand_in_ndk), "-o", str(build), *shape)
    out = tmp_path / "dist"
    _cli("package", "android", str(build), "-o", str(out), "--package", "com.example.gpu", "--class-name", "Classifier",
         "--ndk", str(stand_in_ndk))

    aar = next(out.glob("*.aar"))
    with zipfile.ZipFile(aar) as z:
        names = set(z.namelist())
        abis = {n.split("/")[1] for n in names if n.startswith("jni/")}
        assert abis == {"arm64-v8a"}
        for abi in abis:
            for lib in ("libtvm_opencl.so", "libtvm_runtime.so", "libtvm_ffi.so", "libedgepack_jni.so",
                        "libedgepack_model_classifier.so"):
                assert f"jni/{abi}/{lib}" in names, (lib, sorted(names))
            plugin = z.read(f"jni/{abi}/libtvm_opencl.so")
            assert plugin[:4] == b"\x7fELF" and int.from_bytes(plugin[18:20], "little") == EM_AARCH64
    # the Gradle module ships the plug-in as a prebuilt library of the ABI too
    module = next(p for p in out.iterdir() if p.is_dir())
    assert (module / "src" / "main" / "jniLibs" / "arm64-v8a" / "libtvm_opencl.so").is_file()
    # the generated class finds the plug-in before opening the model, so both sit in one directory
    java = (module / "src" / "main" / "java" / "com" / "example" / "gpu" / "Classifier.java").read_text()
    load = java[java.index("public static Classifier load(Context context)"):]
    assert load.index('AndroidLibraries.find(context, "libtvm_opencl.so")') < load.index("NativeModel.open(")


def test_cpu_aar_has_no_gpu_plugin(stand_in_ndk, models, tmp_path):
    model = models["ppocr_cls"]
    shape = [a for name, dims in model.input_shapes.items() for a in ("--input-shape", f"{name}:{','.join(map(str, dims))}")]
    build = tmp_path / "build"
    _cli("compile", str(model.path), "--profile", "android-arm64", "--ndk", str(stand_in_ndk), "-o", str(build), *shape)
    out = tmp_path / "dist"
    _cli("package", "android", str(build), "-o", str(out), "--package", "com.example.cpu", "--ndk", str(stand_in_ndk))
    with zipfile.ZipFile(next(out.glob("*.aar"))) as z:
        assert not [n for n in z.namelist() if "libtvm_opencl" in n or "libtvm_vulkan" in n]


def test_an_aar_carries_the_cpu_kernels_of_a_program_with_a_cpu_fallback(stand_in_ndk, tmp_path):
    """android-mali has no 64-bit floats (``[limits] fp64 = false``): a model's double operators run on the
    phone's CPU in the same program, so the AAR's arm64 model library holds their kernels as host code beside the
    OpenCL kernels, which hold no double."""
    import json

    from model_factory import onnx_doubles

    build = tmp_path / "build"
    _cli("compile", str(onnx_doubles(tmp_path / "doubles.onnx")), "--profile", "android-mali", "--precision", "fp32",
         "--ndk", str(stand_in_ndk), "-o", str(build))
    extra = json.loads((build / "manifest.json").read_text())["extra"]["opencl"]
    assert extra["cpu_fallback"] and extra["cpu_operators"], extra
    assert "double" not in (build / "device" / "kernels.cl").read_text()
    out = tmp_path / "dist"
    _cli("package", "android", str(build), "-o", str(out), "--package", "com.example.doubles", "--class-name", "Scaled",
         "--ndk", str(stand_in_ndk))
    with zipfile.ZipFile(next(out.glob("*.aar"))) as z:
        library = z.read("jni/arm64-v8a/libedgepack_model_scaled.so")
    assert library[:4] == b"\x7fELF" and int.from_bytes(library[18:20], "little") == EM_AARCH64
    assert all(name.encode() in library for name in extra["cpu_fallback"]), extra["cpu_fallback"]
