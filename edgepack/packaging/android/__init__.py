"""Android packaging: an AAR (and a Gradle module) holding a model, the TVM runtime, the backend's runtime
plug-ins and a Java API.

    dist/mnv2-android/
      edgepack-<model>.aar          classes.jar, AndroidManifest.xml, proguard.txt, R.txt,
                                    jni/<abi>/libedgepack_jni.so, libtvm_runtime.so, libtvm_ffi.so,
                                    libedgepack_model_<class>.so (+ libc++_shared.so if needed;
                                    GPU builds: the plug-in, e.g. libtvm_opencl.so)
      edgepack-<model>/             the same as a Gradle library module, for building from source
        build.gradle, consumer-rules.pro, src/main/AndroidManifest.xml, src/main/java/...,
        src/main/cpp/ (CMakeLists.txt, edgepack_jni.c, edgepack.c, headers, prebuilt/<abi>/ runtime),
        src/main/jniLibs/<abi>/ (the model library)
      README.md                     how to use this model from Java and Kotlin
      manifest.json                 every file with size and sha256; inputs, outputs, ABIs

The Java API is two layers: the generic core ``ai.edgepack`` (``NativeModel``, ``TensorInfo``,
``DType``, ``EdgepackException``, ``AndroidLibraries``; sources in ``runtimes/api/android/java``) and a
class generated per model in the user's package with the typed names and shapes of the manifest
(``java.generate_java_sources``). The JNI layer (``runtimes/api/android/jni/edgepack_jni.c``) is thin C
over the C API of the C bundle (``runtimes/api/c/src/edgepack.c``), which holds all runtime logic.

Native code for Android is built with the NDK's clang only; without an NDK ``package_android`` stops
with a message telling how to provide one. ``aar.assemble_aar`` itself takes any per-ABI libraries and
checks each one's ELF machine against its ABI directory, so that a library for the wrong
architecture can never end up in an AAR.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack.backends import backend_for
from edgepack.errors import EdgepackError, ToolchainError
from edgepack.files import atomic_directory, check_output_dir
from edgepack.frontends import import_model
from edgepack.manifest import read_manifest
from edgepack.packaging.android.aar import (
    JNI_LIBRARY,
    AbiLibraries,
    PackageFile,
    build_jni_library,
    write_android_package,
)
from edgepack.packaging.android.elf import ANDROID_SYSTEM_LIBS, check_elf_for_abi, read_elf
from edgepack.packaging.android.java import (
    check_class_name,
    check_java_package,
    default_class_name,
    generate_java_sources,
    java_tensors,
    model_name_of,
)
from edgepack.packaging.android.javac import compile_java_api, find_android_jar, make_jar
from edgepack.processing import build_program, model_dims, model_input_shapes
from edgepack.profiles import get_profile, profile_from_dict
from edgepack.progress import Progress, reporter
from edgepack.toolchain.android_ndk import ABIS, MIN_SDK, AbiSpec, Ndk, find_ndk
from edgepack.toolchain.model_library import export_model_shared
from edgepack.toolchain.tvm_runtime import ensure_target_runtime
from edgepack.versions import __version__

PACKAGE_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class AndroidPackage:
    """What ``package_android`` wrote."""

    output_dir: Path
    aar: Path
    module_dir: Path
    model_name: str
    java_package: str
    class_name: str
    abis: tuple[str, ...]
    inputs: tuple[Any, ...]  # tensors.TensorSpec
    outputs: tuple[Any, ...]
    files: tuple[PackageFile, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format_version": 1,
            "edgepack_version": __version__,
            "model": self.model_name,
            "aar": self.aar.name,
            "gradle_module": self.module_dir.name,
            "java_class": f"{self.java_package}.{self.class_name}",
            "abis": list(self.abis),
            "min_sdk": MIN_SDK,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "files": [vars(f) for f in self.files],
        }


def _bundle_dependencies(libs: list[Path], abi: AbiSpec, ndk: Ndk) -> list[Path]:
    """Libraries the set needs beyond itself and Android's system libraries (libc++_shared.so from
    the NDK sysroot); a need that cannot be met is an error."""
    present = {p.name for p in libs}
    extra: list[Path] = []
    pending = list(libs)
    while pending:
        lib = pending.pop()
        for need in read_elf(lib).needed:
            if need in present or need in ANDROID_SYSTEM_LIBS:
                continue
            candidate = ndk.sysroot / "usr" / "lib" / abi.sysroot_triple / need
            if not candidate.is_file():
                raise ToolchainError(f"{lib.name} for {abi.name} needs {need}, which is neither packaged nor an"
                                     " Android system library.", f"It was looked for in {candidate.parent}.")
            present.add(need)
            extra.append(candidate)
            pending.append(candidate)
    return extra


# ----------------------------------------------------------------------------------------------
# the whole thing


def package_android(
    build_dir: Path | str,
    output_dir: Path | str,
    *,
    java_package: str,
    ndk: str | None = None,
    abis: Sequence[str] = ("arm64-v8a",),
    class_name: str | None = None,
    android_jar: Path | str | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> AndroidPackage:
    """Make the Android package of a build compiled for an Android profile (see the module docstring).

    Needs the Android NDK (``ndk``, ``$ANDROID_NDK_HOME`` or ``$TVM_NDK_CC``); without one it stops
    with a ToolchainError saying how to provide one. For each ABI it builds (or takes from the
    cache) the TVM runtime with the NDK clang, builds the JNI library, and takes the model library
    (the build's own for its ABI, compiled again for the others); the Java API is compiled with
    javac against ``android_jar`` (default: the SDK in ``$ANDROID_HOME``, else edgepack's stubs).
    """
    say = reporter(progress)
    build_dir, output_dir = Path(build_dir), Path(output_dir)
    check_java_package(java_package)
    abis = tuple(dict.fromkeys(abis))
    unknown = [a for a in abis if a not in ABIS]
    if not abis or unknown:
        raise EdgepackError(f"Unknown or missing Android ABI: {', '.join(unknown) or '(none)'}.",
                            "Use --abi arm64-v8a (default), armeabi-v7a or x86_64 (the emulator); repeat for several.")
    manifest = read_manifest(build_dir)
    class_name = check_class_name(class_name or default_class_name(manifest))
    java_tensors(manifest)  # unsupported dtypes/shapes fail now, not after the builds

    profile = profile_from_dict(manifest.profile)
    backend = backend_for(profile)
    ndk_tools = find_ndk(profile if profile.toolchain.ndk else get_profile("android-arm64"), ndk)
    if "android" not in profile.triple:
        raise EdgepackError(
            f"{build_dir} was compiled for {profile.name} ({profile.triple}), not for Android.",
            "Compile the model for Android first: `edgepack compile MODEL --profile android-arm64 --ndk PATH -o DIR`."
            " package android never puts a non-Android library into an AAR.",
        )
    build_abi = next((a for a in ABIS.values() if a.triple == profile.triple), None)
    check_output_dir(output_dir, force)

    libraries: dict[str, AbiLibraries] = {}
    runtime_include_dirs: tuple[Path, ...] = ()
    meta = (build_dir / manifest.artifacts["device_meta"].path).read_text()
    imported = None
    with tempfile.TemporaryDirectory(prefix="edgepack-android-") as tmp_name:
        tmp = Path(tmp_name)
        for abi_name in abis:
            abi = ABIS[abi_name]
            cc, cxx = ndk_tools.compilers(abi, primary=build_abi is abi)
            say(f"Preparing the TVM runtime for {abi.name} ({abi.triple})")
            runtime = ensure_target_runtime(abi.triple, cc, cxx, need_static=False,
                                                   extra_flags=abi.runtime_flags or None, log=say)
            runtime_include_dirs = runtime.include_dirs
            if build_abi is abi:
                model_lib = build_dir / manifest.artifacts["device_library"].path
            else:
                say(f"Compiling the model for {abi.name}")
                if imported is None:
                    imported = build_program(import_model(build_dir / manifest.model_file,
                                                          model_input_shapes(manifest),
                                                          model_dims(manifest)),
                                             manifest, backend.no_byte_tensors)
                exe = backend.build(imported, _abi_target(profile, abi), limits=profile.limits).executable
                model_lib = export_model_shared(exe, tmp / abi.name / "model.so", cxx, meta_text=meta, cc=cc,
                                                       options=["-s", *abi.runtime_flags],
                                                packed=backend.packed_modules(), log=None)
            say(f"Building {JNI_LIBRARY} for {abi.name}")
            jni = build_jni_library(runtime, tmp / abi.name / "jni" / JNI_LIBRARY, cc, android=True, strip=True)
            plugins = backend.android_files(abi.triple, cc, cxx, log=say)  # e.g. libtvm_opencl.so for GPU builds
            libs = [jni, *runtime.shared_libs, model_lib, *plugins]
            for lib in libs:
                check_elf_for_abi(abi.name, lib)
            extra = _bundle_dependencies(libs, abi, ndk_tools)
            for lib in (*libs, *extra):
                align = read_elf(lib).min_load_align
                if align < 16384:
                    say(f"Note: {lib.name} ({abi.name}) has {align}-byte LOAD alignment; devices with 16 KiB pages"
                        " (Android 15+) need 16384: use NDK r28 or newer.")
            libraries[abi.name] = AbiLibraries(jni=jni, runtime=runtime.shared_libs, model=model_lib,
                                               extra=(*plugins, *extra))
            plugin_names = [p.name for p in plugins]

        say("Compiling the Java API")
        sources = generate_java_sources(manifest, java_package, class_name, plugin_names)
        jar_source = Path(android_jar) if android_jar else find_android_jar()
        classes, _classpath = compile_java_api(sources, tmp / "java", android_jar=jar_source)
        classes_jar = make_jar(classes, tmp / "classes.jar")

        say("Assembling the AAR and the Gradle module")
        with atomic_directory(output_dir, force=force) as staging:
            _aar, _module, files = write_android_package(
                staging, manifest=manifest, java_package=java_package, class_name=class_name,
                libraries=libraries, classes_jar=classes_jar, sources=sources,
                runtime_include_dirs=runtime_include_dirs)
            model_name = model_name_of(manifest)
            result = AndroidPackage(output_dir=output_dir, aar=output_dir / f"edgepack-{model_name}.aar",
                                    module_dir=output_dir / f"edgepack-{model_name}", model_name=model_name,
                                    java_package=java_package, class_name=class_name, abis=abis,
                                    inputs=manifest.inputs, outputs=manifest.outputs, files=files)
            (staging / PACKAGE_MANIFEST).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def _abi_target(profile, abi: AbiSpec):
    """The build's target for another ABI: a CPU build gets the ABI's CPU target, a GPU build keeps its
    kernels' target with the ABI's CPU as host."""
    import tvm

    if profile.host_target:
        return tvm.target.Target(profile.target, host=abi.tvm_target)
    return tvm.target.Target(abi.tvm_target)
