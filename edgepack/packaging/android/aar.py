"""Assembling the Android package: the JNI library, the AAR (without Gradle), a Gradle module and a README."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack.errors import EdgepackError, ToolchainError
from edgepack.files import atomic_file, file_sha256
from edgepack.manifest import BuildManifest
from edgepack.packaging.android.elf import check_abi_library
from edgepack.packaging.android.java import (
    android_sources_dir,
    check_java_package,
    dim_text,
    dynamic_dims,
    java_tensors,
    model_library_name,
    model_name_of,
    takes_bitmaps,
)
from edgepack.packaging.android.javac import zip_write
from edgepack.processing import manifest_plan
from edgepack.progress import Progress
from edgepack.toolchain.android_ndk import MIN_SDK
from edgepack.toolchain.sources import C_API, C_API_PRIVATE_HEADERS, c_api_sources, source_dir

COMPILE_SDK = 34
JNI_LIBRARY = "libedgepack_jni.so"


@dataclass(frozen=True)
class PackageFile:
    path: str  # relative to the output directory
    size: int
    sha256: str

# ----------------------------------------------------------------------------------------------
# native libraries


def build_jni_library(
    runtime: Any,
    out: Path,
    cc: str,
    jni_include_dirs: Sequence[Path] = (),
    *,
    cflags: Sequence[str] | None = None,
    ldflags: Sequence[str] = (),
    rpath: Sequence[str] = (),
    android: bool = False,
    strip: bool = False,
    werror: bool = False,
    log: Progress | None = None,
) -> Path:
    """Build ``libedgepack_jni.so``: ``edgepack_jni.c`` + the C API (``edgepack.c``), linked against
    the shared TVM runtime of ``runtime`` (a ``native.TargetRuntime``) with ``cc``.

    ``jni_include_dirs``: where jni.h is (the JDK's for a host build; none for the NDK, whose sysroot
    has it). ``cflags`` default to the flags the runtime was built with. ``android`` adds the
    16 KiB page alignment Android 15 devices need.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not shutil.which(cc):
        raise ToolchainError(f"The C compiler {cc} is not installed.", "Install it or pass its full path.")
    if len(runtime.shared_libs) != 2:
        raise ToolchainError(f"The {runtime.triple} runtime in {runtime.root} has no shared libraries.")
    c_dir = source_dir(C_API)
    flags = list(cflags) if cflags is not None else list(runtime.cflags)
    cmd: list[str] = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", *(["-Werror"] if werror else []), "-fPIC",
                      "-fvisibility=hidden", *flags, "-I", str(c_dir / "include")]
    for inc in (*runtime.include_dirs, *jni_include_dirs):
        cmd += ["-I", str(inc)]
    cmd += [str(android_sources_dir() / "jni" / "edgepack_jni.c"), *map(str, c_api_sources())]
    lib_dirs = list(dict.fromkeys(str(p.parent) for p in runtime.shared_libs))
    cmd += ["-shared", f"-Wl,-soname,{JNI_LIBRARY}", "-Wl,--no-undefined", *(f"-L{d}" for d in lib_dirs),
            "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi", "-Wl,--as-needed", "-lpthread", "-ldl", "-lm"]
    if android:
        cmd += ["-Wl,-z,max-page-size=16384"]
    if rpath:
        cmd.append("-Wl,-rpath," + ":".join(rpath))
    if strip:
        cmd.append("-s")
    cmd += [*ldflags, "-o", str(out)]
    if log:
        log("$ " + " ".join(cmd))
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ToolchainError(f"Building {out.name} with {Path(cc).name} failed.",
                             "The last lines of the compiler output:\n"
                             + "\n".join(result.stderr.strip().splitlines()[-25:]))
    if log and result.stderr.strip():
        log(result.stderr.strip())
    return out


# ----------------------------------------------------------------------------------------------
# the AAR


def manifest_xml_text(java_package: str, model_name: str, min_sdk: int = MIN_SDK) -> str:
    return _template("AndroidManifest.xml", java_package=check_java_package(java_package),
                     model_name=model_name, min_sdk=min_sdk)


def proguard_text(java_package: str, class_name: str) -> str:
    return _template("proguard.txt", java_package=java_package, class_name=class_name)


def _template(name: str, **values: Any) -> str:
    """``runtimes/api/android/templates/<name>`` with its ``@key@`` placeholders filled in."""
    text = (android_sources_dir() / "templates" / name).read_text()

    def fill(match: re.Match) -> str:
        if match.group(1) not in values:
            raise KeyError(f"template {name} has no value for @{match.group(1)}@")
        return str(values[match.group(1)])

    return re.sub(r"@([a-z_]+)@", fill, text)


def assemble_aar(
    out_path: Path,
    *,
    classes_jar: Path,
    manifest_xml: Path | str,
    native_libs: Mapping[str, Sequence[Path]],
    proguard: str | None = None,
) -> Path:
    """Write an AAR: ``AndroidManifest.xml``, ``classes.jar``, ``jni/<abi>/*.so``, ``R.txt``
    (empty) and ``proguard.txt`` (consumer rules, if given). No Gradle involved.

    ``manifest_xml`` is the manifest text or a file holding it. Every library is checked: named
    ``lib*.so``, a shared library whose ELF machine and class match its ABI directory
    (arm64-v8a: EM_AARCH64, armeabi-v7a: EM_ARM, x86_64: EM_X86_64, x86: EM_386); one name per ABI.
    The archive is written through a temporary file and is byte-for-byte reproducible.
    """
    out_path = Path(out_path)
    manifest = Path(manifest_xml).read_text() if isinstance(manifest_xml, Path) else str(manifest_xml)
    if "<manifest" not in manifest or "package=" not in manifest:
        raise EdgepackError("The AndroidManifest.xml of an AAR needs a <manifest package=...> element.")
    if not native_libs or not any(native_libs.values()):
        raise EdgepackError("An edgepack AAR needs native libraries for at least one ABI.")
    checked: list[tuple[str, Path]] = []
    for abi, libs in sorted(native_libs.items()):
        names: set[str] = set()
        for lib in libs:
            lib = Path(lib)
            check_abi_library(abi, lib)
            if lib.name in names:
                raise EdgepackError(f"Two libraries named {lib.name} for {abi}.")
            names.add(lib.name)
            checked.append((f"jni/{abi}/{lib.name}", lib))
    with atomic_file(out_path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as aar:
        zip_write(aar, "AndroidManifest.xml", manifest)
        zip_write(aar, "classes.jar", Path(classes_jar).read_bytes())
        zip_write(aar, "R.txt", "")
        if proguard is not None:
            zip_write(aar, "proguard.txt", proguard)
        for name, lib in checked:
            zip_write(aar, name, lib.read_bytes())
    return out_path


# ----------------------------------------------------------------------------------------------
# the Gradle module and the package directory


@dataclass(frozen=True)
class AbiLibraries:
    """The native libraries of one ABI, by role."""

    jni: Path  # libedgepack_jni.so
    runtime: tuple[Path, ...]  # libtvm_ffi.so, libtvm_runtime.so
    model: Path  # the model library (any name; copied as model_library_name(class))
    extra: tuple[Path, ...] = ()  # e.g. the backend's plug-ins (libtvm_opencl.so), libc++_shared.so

    def for_aar(self, class_name: str, tmp: Path) -> list[Path]:
        """The libraries as they go into jni/<abi>/ (the model renamed)."""
        model = Path(tmp) / model_library_name(class_name)
        model.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self.model, model)
        return [self.jni, *self.runtime, model, *self.extra]


def write_gradle_module(
    dest: Path,
    *,
    java_package: str,
    class_name: str,
    model_name: str,
    sources: Mapping[str, str],
    libraries: Mapping[str, AbiLibraries],
    runtime_include_dirs: Sequence[Path],
) -> Path:
    """A Gradle Android library module building the same AAR from source (JNI layer through CMake)."""
    dest = Path(dest)
    main = dest / "src" / "main"
    for rel, text in sources.items():
        path = main / "java" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (main / "AndroidManifest.xml").write_text(manifest_xml_text(java_package, model_name))
    (dest / "consumer-rules.pro").write_text(proguard_text(java_package, class_name))
    abi_filters = ", ".join(f"'{abi}'" for abi in libraries)
    (dest / "build.gradle").write_text(_template(
        "build.gradle", java_package=java_package, module_name=dest.name, model_name=model_name,
        compile_sdk=COMPILE_SDK, min_sdk=MIN_SDK, abi_filters=abi_filters))
    cpp = main / "cpp"
    (cpp / "include" / "tvm" / "ffi").mkdir(parents=True, exist_ok=True)
    (cpp / "include" / "dlpack").mkdir(parents=True, exist_ok=True)
    (cpp / "CMakeLists.txt").write_text(_template("CMakeLists.txt", model_name=model_name))
    shutil.copy2(android_sources_dir() / "jni" / "edgepack_jni.c", cpp / "edgepack_jni.c")
    for path in (*c_api_sources(), *(source_dir(C_API) / "src" / h for h in C_API_PRIVATE_HEADERS)):
        shutil.copy2(path, cpp / path.name)
    shutil.copy2(source_dir(C_API) / "include" / "edgepack.h", cpp / "include" / "edgepack.h")
    for rel in ("tvm/ffi/c_api.h", "dlpack/dlpack.h"):
        found = next((d / rel for d in runtime_include_dirs if (d / rel).is_file()), None)
        if found is None:
            raise ToolchainError(f"The TVM runtime headers have no {rel}.", "Reinstall apache-tvm-ffi.")
        shutil.copy2(found, cpp / "include" / rel)
    for abi, libs in libraries.items():
        prebuilt = cpp / "prebuilt" / abi
        prebuilt.mkdir(parents=True, exist_ok=True)
        for lib in libs.runtime:
            shutil.copy2(lib, prebuilt / lib.name)
        jni_libs = main / "jniLibs" / abi
        jni_libs.mkdir(parents=True, exist_ok=True)
        shutil.copy2(libs.model, jni_libs / model_library_name(class_name))
        # libc++_shared.so comes from the NDK through ANDROID_STL=c++_shared; anything else extra is shipped
        for lib in libs.extra:
            if lib.name != "libc++_shared.so":
                shutil.copy2(lib, jni_libs / lib.name)
    return dest


def usage_text(manifest: BuildManifest, java_package: str, class_name: str, aar_name: str, module_name: str) -> str:
    """README.md of a package: the three lines for this model, in Java and Kotlin."""
    inputs, outputs = java_tensors(manifest)
    cls = class_name

    def row(kind: str, t) -> str:
        buffer = f"`out.{t.ident}` (as large as the run made it)" if kind == "output" and t.is_dynamic else \
            f"`{cls}.{t.allocator}()`"
        return f"| {kind} | `{t.name}` | {t.dtype} | {t.shape_text} | {buffer} |"

    io = "\n".join([*(row("input", t) for t in inputs), *(row("output", t) for t in outputs)])
    java_in = "\n".join(f"    {t.buffer_type} {t.ident} = {cls}.{t.allocator}();   // fill it" for t in inputs)
    kt_in = "\n".join(f"    val {t.ident} = {cls}.{t.allocator}()   // fill it" for t in inputs)
    args = ", ".join(t.ident for t in inputs)
    dims = dynamic_dims(manifest)
    dynamic = ""
    if dims:  # each dynamic input with the shape of its values
        args = ", ".join(t.ident + (", new long[] {" + ", ".join(str(d).lower() for d in t.shape) + "}"
                                    if t.is_dynamic else "") for t in inputs)
        kt_args = ", ".join(t.ident + (", longArrayOf(" + ", ".join(str(d).lower() for d in t.shape) + ")"
                                       if t.is_dynamic else "") for t in inputs)
        dynamic = (f"\nThe model runs at every size in {', '.join(dim_text(r) for r in dims)} (one build, `--dim`): "
                   "pass each dynamic input with the shape of its values (`new...Buffer()` has room for the largest); "
                   f"`out.<name>Shape` is each output's shape in that run. A size off the range or the step throws "
                   "`EdgepackException` (`EP_ERR_SHAPE`) naming the dimension and its range.\n")
    plan = manifest_plan(manifest)
    processing = ""
    if plan is not None:
        lines = [f"- `{t.name}`: {plan.describe(t.name)}" for t in (*inputs, *outputs) if plan.describe(t.name)]
        processing = ("\nPre- and post-processing are compiled into the model (edgepack's docs/processing.md):\n\n"
                      + "\n".join(lines) + "\n")
        if takes_bitmaps(manifest):
            processing += (f"\nFrom an Android `Bitmap` of `{cls}.FRAME_WIDTH` x `{cls}.FRAME_HEIGHT` pixels: "
                           "`model.run(bitmap)`.\n")
    return f"""# {model_name_of(manifest)} for Android (edgepack)

Add the AAR to your app and call the generated class `{java_package}.{cls}`:

```groovy
dependencies {{ implementation files('libs/{aar_name}') }}     // app/build.gradle
```

Java:
```java
try ({cls} model = {cls}.load(context)) {{
{java_in}
    {cls}.Outputs out = model.run({args});
    // out.{outputs[0].ident} holds output `{outputs[0].name}`
}}
```

Kotlin:
```kotlin
{cls}.load(context).use {{ model ->
{kt_in}
    val out = model.run({kt_args if dims else args})
}}
```

| | tensor | dtype | shape | buffer |
| --- | --- | --- | --- | --- |
{io}
{processing}{dynamic}
Buffers are direct NIO buffers in native byte order (the `new...Buffer()` methods make them 64-byte aligned,
so inputs are read in place, without a copy). Errors are `ai.edgepack.EdgepackException` with the native
runtime's message. {"`run(inputs...)` returns new buffers sized by the run; `nativeModel().getOutput(i, dst)` "
                      "writes into buffers you keep." if dims else "`run(inputs..., outputs...)` writes into buffers you keep and reuse."}

To build from source instead: copy `{module_name}/` into your project, `include ':{module_name}'` in
settings.gradle and `implementation project(':{module_name}')`.
"""


def _package_file(root: Path, path: Path) -> PackageFile:
    return PackageFile(path.relative_to(root).as_posix(), path.stat().st_size, file_sha256(path))


def write_android_package(
    staging: Path,
    *,
    manifest: BuildManifest,
    java_package: str,
    class_name: str,
    libraries: Mapping[str, AbiLibraries],
    classes_jar: Path,
    sources: Mapping[str, str],
    runtime_include_dirs: Sequence[Path],
) -> tuple[Path, Path, tuple[PackageFile, ...]]:
    """Lay out a package directory (AAR, Gradle module, README.md, manifest.json) in ``staging``.

    ``package_android`` calls it with Android libraries only; the AAR step checks every library's
    ELF machine against its ABI directory whatever the caller passes.
    """
    staging = Path(staging)
    model_name = model_name_of(manifest)
    aar_name = f"edgepack-{model_name}.aar"
    module_dir = staging / f"edgepack-{model_name}"
    with tempfile.TemporaryDirectory(prefix="edgepack-aar-") as tmp:
        per_abi = {abi: libs.for_aar(class_name, Path(tmp) / abi) for abi, libs in libraries.items()}
        aar = assemble_aar(staging / aar_name, classes_jar=classes_jar,
                           manifest_xml=manifest_xml_text(java_package, model_name),
                           native_libs=per_abi, proguard=proguard_text(java_package, class_name))
    write_gradle_module(module_dir, java_package=java_package, class_name=class_name, model_name=model_name,
                        sources=sources, libraries=libraries, runtime_include_dirs=runtime_include_dirs)
    (staging / "README.md").write_text(usage_text(manifest, java_package, class_name, aar_name, module_dir.name))
    files = tuple(_package_file(staging, p) for p in sorted(staging.rglob("*")) if p.is_file())
    return aar, module_dir, files


