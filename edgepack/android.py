"""Android packaging: an AAR (and a Gradle module) holding a model, the TVM runtime and a Java API.

    dist/mnv2-android/
      edgepack-<model>.aar          classes.jar, AndroidManifest.xml, proguard.txt, R.txt,
                                    jni/<abi>/libedgepack_jni.so, libtvm_runtime.so, libtvm_ffi.so,
                                    libedgepack_model_<class>.so (+ libc++_shared.so if needed)
      edgepack-<model>/             the same as a Gradle library module, for building from source
        build.gradle, consumer-rules.pro, src/main/AndroidManifest.xml, src/main/java/...,
        src/main/cpp/ (CMakeLists.txt, edgepack_jni.c, edgepack.c, headers, prebuilt/<abi>/ runtime),
        src/main/jniLibs/<abi>/ (the model library)
      README.md                     how to use this model from Java and Kotlin
      manifest.json                 every file with size and sha256; inputs, outputs, ABIs

The Java API is two layers: the generic core ``ai.edgepack`` (``NativeModel``, ``TensorInfo``,
``DType``, ``EdgepackException``, ``AndroidLibraries``; sources in ``runtimes/android/java``) and a
class generated per model in the user's package with the typed names and shapes of the manifest
(``generate_java_sources``). The JNI layer (``runtimes/android/jni/edgepack_jni.c``) is thin C over
the C API of the C bundle (``runtimes/c/src/edgepack.c``), which holds all runtime logic.

Native code for Android is built with the NDK's clang only; without an NDK ``package_android``
stops with a message telling how to provide one. ``assemble_aar`` itself takes any per-ABI
libraries and checks each one's ELF machine against its ABI directory, so that a library for the
wrong architecture can never end up in an AAR.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack import __version__
from edgepack.errors import EdgepackError, ToolchainError
from edgepack.fileutil import file_sha256
from edgepack.manifest import BuildManifest

Progress = Callable[[str], None]

MIN_SDK = 24
COMPILE_SDK = 34
JAVA_RELEASE = "8"  # classes.jar bytecode: what every Android toolchain (D8) accepts
CORE_PACKAGE = "ai.edgepack"
JNI_LIBRARY = "libedgepack_jni.so"
PACKAGE_MANIFEST = "manifest.json"

EM_386, EM_ARM, EM_X86_64, EM_AARCH64 = 3, 40, 62, 183


@dataclass(frozen=True)
class AbiSpec:
    """One Android ABI: how its libraries look and how to build for it."""

    name: str  # the directory name in jni/ and lib/
    machine: int  # ELF e_machine
    elf_class: int  # 1: 32-bit, 2: 64-bit
    triple: str  # the triple of the runtime cache and the NDK clang prefix (before the API level)
    sysroot_triple: str  # directory of sysroot/usr/lib/<triple>/ holding libc++_shared.so
    tvm_target: dict[str, Any]  # TVM target of the model library
    runtime_flags: tuple[str, ...] = ()  # compiler flags of the TVM runtime build


ABIS: dict[str, AbiSpec] = {
    "arm64-v8a": AbiSpec("arm64-v8a", EM_AARCH64, 2, "aarch64-linux-android", "aarch64-linux-android",
                         {"kind": "llvm", "mtriple": "aarch64-linux-android", "mattr": ["+neon"]}),
    # armeabi-v7a: soft-float calling convention (softfp) with NEON, as the NDK builds it
    "armeabi-v7a": AbiSpec("armeabi-v7a", EM_ARM, 1, "armv7a-linux-androideabi", "arm-linux-androideabi",
                           {"kind": "llvm", "mtriple": "armv7a-linux-androideabi", "mattr": ["+neon"]},
                           ("-march=armv7-a", "-mfloat-abi=softfp", "-mfpu=neon")),
    # x86_64: the Android emulator; the ABI guarantees SSE4.2 and POPCNT
    "x86_64": AbiSpec("x86_64", EM_X86_64, 2, "x86_64-linux-android", "x86_64-linux-android",
                      {"kind": "llvm", "mtriple": "x86_64-linux-android", "mattr": ["+sse4.2", "+popcnt"]}),
}
#: What ``assemble_aar`` accepts (x86 too, though edgepack does not build for it).
ABI_MACHINES: dict[str, tuple[int, int]] = {
    **{name: (spec.machine, spec.elf_class) for name, spec in ABIS.items()},
    "x86": (EM_386, 1),
}
_MACHINE_NAMES = {EM_386: "x86 (EM_386)", EM_ARM: "32-bit ARM (EM_ARM)", EM_X86_64: "x86-64 (EM_X86_64)",
                  EM_AARCH64: "AArch64 (EM_AARCH64)"}

#: Libraries every Android device provides (NDK stable APIs); anything else a library needs must
#: be in the same ABI directory.
ANDROID_SYSTEM_LIBS = frozenset({
    "libc.so", "libm.so", "libdl.so", "liblog.so", "libz.so", "libandroid.so", "libjnigraphics.so",
    "libEGL.so", "libGLESv2.so", "libGLESv3.so", "libvulkan.so", "libOpenSLES.so", "libaaudio.so",
    "libmediandk.so", "libnativewindow.so", "libneuralnetworks.so", "libsync.so", "libcamera2ndk.so",
    "libstdc++.so", "libamidi.so", "libbinder_ndk.so",
})

_JAVA_KEYWORDS = frozenset({
    "abstract", "assert", "boolean", "break", "byte", "case", "catch", "char", "class", "const", "continue",
    "default", "do", "double", "else", "enum", "extends", "final", "finally", "float", "for", "goto", "if",
    "implements", "import", "instanceof", "int", "interface", "long", "native", "new", "package", "private",
    "protected", "public", "return", "short", "static", "strictfp", "super", "switch", "synchronized",
    "this", "throw", "throws", "transient", "try", "void", "volatile", "while", "true", "false", "null",
    "var", "record", "yield", "sealed", "permits",
})

_JAVA_BUFFERS = {  # dtype -> (buffer class, ByteBuffer view method or None)
    "float32": ("FloatBuffer", "asFloatBuffer"), "float64": ("DoubleBuffer", "asDoubleBuffer"),
    "float16": ("ShortBuffer", "asShortBuffer"), "bfloat16": ("ShortBuffer", "asShortBuffer"),
    "int8": ("ByteBuffer", None), "uint8": ("ByteBuffer", None), "bool": ("ByteBuffer", None),
    "int16": ("ShortBuffer", "asShortBuffer"), "uint16": ("ShortBuffer", "asShortBuffer"),
    "int32": ("IntBuffer", "asIntBuffer"), "uint32": ("IntBuffer", "asIntBuffer"),
    "int64": ("LongBuffer", "asLongBuffer"), "uint64": ("LongBuffer", "asLongBuffer"),
}


# ----------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class PackageFile:
    path: str  # relative to the output directory
    size: int
    sha256: str


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
    inputs: tuple[Any, ...]  # importers.TensorSpec
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


# ----------------------------------------------------------------------------------------------
# locations and names


def android_sources_dir() -> Path:
    """``runtimes/android`` (JNI C source, Java core, templates, compile-time Android stubs)."""
    from edgepack.native import runtimes_dir

    return runtimes_dir() / "android"


def core_java_sources() -> dict[str, str]:
    """The generic Java core (``ai/edgepack/*.java``), by path relative to the source root."""
    root = android_sources_dir() / "java"
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.java"))}


def android_stub_sources() -> dict[str, str]:
    """Compile-time stand-ins for the few Android SDK classes the core uses (never packaged)."""
    root = android_sources_dir() / "stubs"
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*.java"))}


def model_name_of(manifest: BuildManifest) -> str:
    """A file-name-safe model name: the stem of the source model (``mobilenetv2``)."""
    stem = Path(manifest.model_source).stem or Path(manifest.model_file).stem
    name = re.sub(r"[^A-Za-z0-9_]+", "_", stem).strip("_").lower()
    return name or "model"


def default_class_name(manifest: BuildManifest) -> str:
    """``face_detection_short_range`` -> ``FaceDetectionShortRange``."""
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", model_name_of(manifest)) if p]
    name = "".join(p[0].upper() + p[1:] for p in parts) or "Model"
    return name if name[0].isalpha() else "Model" + name


def model_library_name(class_name: str) -> str:
    """File name of the model library in ``jni/<abi>/``: ``libedgepack_model_<class>.so``."""
    return f"libedgepack_model_{re.sub(r'[^a-z0-9_]', '_', class_name.lower())}.so"


def check_java_package(java_package: str) -> str:
    parts = java_package.split(".")
    if not java_package or not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) and p not in _JAVA_KEYWORDS
                                   for p in parts):
        raise EdgepackError(f"{java_package!r} is not a valid Java package name.",
                            "Use dot-separated identifiers, e.g. --package com.example.vision.")
    if java_package == CORE_PACKAGE or java_package.startswith(CORE_PACKAGE + "."):
        raise EdgepackError(f"The package {java_package!r} is edgepack's own ({CORE_PACKAGE}).",
                            "Use your app's package, e.g. --package com.example.vision.")
    return java_package


def check_class_name(class_name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", class_name) or class_name in _JAVA_KEYWORDS:
        raise EdgepackError(f"{class_name!r} is not a valid Java class name.",
                            "Use an identifier such as MobileNetV2 (--class-name).")
    return class_name


# ----------------------------------------------------------------------------------------------
# the generated Java class


@dataclass(frozen=True)
class JavaTensor:
    """How one model input/output appears in the generated class."""

    index: int
    name: str  # the tensor name in the model
    dtype: str
    shape: tuple[int, ...]
    ident: str  # Java identifier: parameter and Outputs field (``input``)
    constant: str  # TensorInfo constant (``INPUT_INPUT``, ``OUTPUT_LOGITS``)
    buffer_type: str  # FloatBuffer, ...
    view_method: str | None  # ByteBuffer method giving that view (None for ByteBuffer)

    @property
    def allocator(self) -> str:
        """The static method that allocates a buffer for this tensor (``newInputBuffer``)."""
        return "new" + self.ident[0].upper() + self.ident[1:] + "Buffer"

    @property
    def element_count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _words(name: str) -> list[str]:
    return [p for p in re.split(r"[^0-9A-Za-z]+", name) if p]


def _ident(name: str, fallback: str) -> str:
    parts = _words(name) or [fallback]
    ident = parts[0][0].lower() + parts[0][1:] + "".join(p[0].upper() + p[1:] for p in parts[1:])
    if ident[0].isdigit():
        ident = "t" + ident
    return ident + "Tensor" if ident in _JAVA_KEYWORDS else ident


def _constant(name: str, fallback: str) -> str:
    words = "_".join(_words(name) or [fallback])
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", words).upper()


def _unique(value: str, taken: set[str]) -> str:
    candidate, n = value, 2
    while candidate in taken:
        candidate, n = f"{value}{n}", n + 1
    taken.add(candidate)
    return candidate


def java_tensors(manifest: BuildManifest) -> tuple[tuple[JavaTensor, ...], tuple[JavaTensor, ...]]:
    """The inputs and outputs of ``manifest`` as the generated class names them."""
    idents: set[str] = {"model", "out"}  # locals of the generated methods
    constants: set[str] = {"LIBRARY_FILE", "MODEL_SHA256", "INPUTS", "OUTPUTS"}
    result: list[list[JavaTensor]] = [[], []]
    for slot, (kind, specs) in enumerate((("input", manifest.inputs), ("output", manifest.outputs))):
        for i, spec in enumerate(specs):
            dtype = str(spec.dtype)
            if dtype not in _JAVA_BUFFERS:
                raise EdgepackError(f"The {kind} {spec.name!r} has dtype {dtype}, which the Java API does not support.",
                                    "Supported: " + ", ".join(sorted(_JAVA_BUFFERS)) + ".")
            shape = tuple(int(d) for d in spec.shape)
            if any(d < 0 for d in shape):
                raise EdgepackError(f"The {kind} {spec.name!r} has a dynamic shape {shape}.",
                                    "Compile the model with static shapes (--input-shape).")
            buffer_type, view = _JAVA_BUFFERS[dtype]
            result[slot].append(JavaTensor(
                index=i, name=str(spec.name), dtype=dtype, shape=shape,
                ident=_unique(_ident(str(spec.name), f"{kind}{i}"), idents),
                constant=_unique(f"{kind.upper()}_{_constant(str(spec.name), str(i))}", constants),
                buffer_type=buffer_type, view_method=view))
    return tuple(result[0]), tuple(result[1])


def _java_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0x20 <= ord(ch) < 0x7F:
            out.append(ch)
        else:
            out.extend(f"\\u{unit:04x}" for unit in struct.unpack(f"<{len(ch.encode('utf-16-le')) // 2}H",
                                                                  ch.encode("utf-16-le")))
    return '"' + "".join(out) + '"'


def _doc_text(text: str) -> str:
    """Text safe inside a Javadoc comment ({@code ...} content)."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("@", "&#64;")
            .replace("*/", "*&#47;").replace("{", "&#123;").replace("}", "&#125;"))


def _describe(t: JavaTensor) -> str:
    return f"<code>{_doc_text(t.name)}</code>: {t.dtype} {list(t.shape)}"


def generate_model_class(manifest: BuildManifest, java_package: str, class_name: str) -> str:
    """The Java source of the per-model class (see ``generate_java_sources``)."""
    check_java_package(java_package)
    check_class_name(class_name)
    inputs, outputs = java_tensors(manifest)
    cls = class_name
    buffer_types = sorted({t.buffer_type for t in (*inputs, *outputs)} | {"ByteBuffer"})
    lines: list[str] = []
    add = lines.append

    add(f"// Generated by edgepack {__version__} from {Path(manifest.model_source).name}"
        f" (sha256 {manifest.model_sha256[:16]}...). Do not edit: run `edgepack package android` again.")
    add(f"package {java_package};")
    add("")
    for imp in ("ai.edgepack.AndroidLibraries", "ai.edgepack.DType", "ai.edgepack.EdgepackException",
                "ai.edgepack.NativeModel", "ai.edgepack.TensorInfo", "android.content.Context", "java.io.File",
                "java.nio.Buffer", *(f"java.nio.{b}" for b in buffer_types), "java.util.Arrays",
                "java.util.Collections", "java.util.List"):
        add(f"import {imp};")
    add("")
    add("/**")
    add(f" * The model <code>{_doc_text(model_name_of(manifest))}</code> compiled by edgepack (Apache TVM) for"
        " Android CPUs.")
    add(" *")
    add(" * <p>Inputs:")
    add(" * <ul>")
    for t in inputs:
        add(f" *   <li>{_describe(t)}</li>")
    add(" * </ul>")
    add(" * <p>Outputs:")
    add(" * <ul>")
    for t in outputs:
        add(f" *   <li>{_describe(t)}</li>")
    add(" * </ul>")
    add(" *")
    add(" * <pre>{@code")
    add(f" * try ({cls} model = {cls}.load(context)) {{")
    for t in inputs:
        add(f" *   {t.buffer_type} {t.ident} = {cls}.{t.allocator}();  // fill {t.element_count} values")
    add(f" *   {cls}.Outputs out = model.run({', '.join(t.ident for t in inputs)});")
    add(f" *   // read out.{outputs[0].ident}")
    add(" * }")
    add(" * }</pre>")
    add(" *")
    add(" * <p>Buffers are NIO buffers read or written from their position; positions are not moved.")
    add(" * Direct buffers in native byte order (as the <code>new...Buffer()</code> methods make them) are")
    add(" * passed to the native runtime without a copy. Calls on one model are serialised; use one model")
    add(" * per thread for parallel runs. Every failure is an {@link EdgepackException} carrying the native")
    add(" * runtime's message.")
    add(" */")
    add(f"public final class {cls} implements AutoCloseable {{")
    add("  /** File name of the model library in the AAR (jni/ABI/) and the app (lib/ABI/). */")
    add(f"  public static final String LIBRARY_FILE = {_java_string(model_library_name(cls))};")
    add("")
    add("  /** SHA-256 of the model file this class was generated from. */")
    add(f"  public static final String MODEL_SHA256 = {_java_string(manifest.model_sha256)};")
    for kind, tensors in (("Input", inputs), ("Output", outputs)):
        for t in tensors:
            dims = ", ".join(f"{d}L" for d in t.shape)
            add("")
            add(f"  /** {kind} {t.index} {_describe(t)}. */")
            add(f"  public static final TensorInfo {t.constant} =")
            add(f"      new TensorInfo({_java_string(t.name)}, DType.{t.dtype.upper()}, new long[] {{{dims}}});")
    for kind, tensors in (("INPUTS", inputs), ("OUTPUTS", outputs)):
        add("")
        add(f"  /** The {kind.lower()} of the model, in order. */")
        add(f"  public static final List<TensorInfo> {kind} =")
        add(f"      Collections.unmodifiableList(Arrays.asList({', '.join(t.constant for t in tensors)}));")
    add("")
    add("  private final NativeModel model;")
    add("")
    add(f"  private {cls}(NativeModel model) {{")
    add("    this.model = model;")
    add("  }")

    def method(doc: list[str], signature: str, body: list[str]) -> None:
        add("")
        add("  /**")
        for d in doc:
            add(f"   * {d}".rstrip())
        add("   */")
        add(f"  {signature} {{")
        for b in body:
            add(f"    {b}")
        add("  }")

    throws_load = "@throws EdgepackException with the native message if the library is missing, built for"
    method([f"Opens the model from the app's native libraries (the AAR puts {model_library_name(cls)}",
            "into lib/ABI/ of the APK).", "",
            "@param context any context of the app", "@return the model; close it when done",
            throws_load, "    another device, or not this model"],
           f"public static {cls} load(Context context)",
           ["return wrap(NativeModel.open(AndroidLibraries.find(context, LIBRARY_FILE)));"])
    method(["Opens the model from a library file (for example one downloaded by the app).", "",
            "@param library the model library, built by edgepack for this device",
            "@return the model; close it when done", throws_load, "    another device, or not this model"],
           f"public static {cls} load(File library)",
           ["return wrap(NativeModel.open(library));"])
    method(["Opens the model from the bytes of its library (position to limit; copied).", "",
            "@param library the bytes of the model library, built by edgepack for this device",
            "@return the model; close it when done",
            "@throws EdgepackException with the native message if the bytes are not this model for this device"],
           f"public static {cls} load(ByteBuffer library)",
           ["return wrap(NativeModel.open(library));"])
    add("")
    add(f"  private static {cls} wrap(NativeModel model) {{")
    add("    try {")
    add(f"      model.checkSignature(INPUTS, OUTPUTS, {_java_string(cls)});")
    add("    } catch (RuntimeException e) {")
    add("      model.close();")
    add("      throw e;")
    add("    }")
    add(f"    return new {cls}(model);")
    add("  }")

    for kind, tensors in (("input", inputs), ("output", outputs)):
        for t in tensors:
            view = f".{t.view_method}()" if t.view_method else ""
            method([f"Allocates a buffer for {kind} {_describe(t)}: {t.element_count} values, direct,",
                    f"{NATIVE_ALIGNMENT}-byte aligned, native byte order.", "",
                    f"@return a new buffer with position 0 and limit {t.element_count}"],
                   f"public static {t.buffer_type} {t.allocator}()",
                   [f"return NativeModel.allocate({t.constant}.byteSize()){view};"])

    in_params = ", ".join(f"{t.buffer_type} {t.ident}" for t in inputs)
    out_params = ", ".join(f"{t.buffer_type} {t.ident}" for t in outputs)
    in_array = ", ".join(t.ident for t in inputs)
    out_array = ", ".join(t.ident for t in outputs)
    param_docs = [f"@param {t.ident} input {_describe(t)}" for t in inputs]
    throws_run = ["@throws EdgepackException with the native message (wrong buffer size, closed model,",
                  "    runtime failure)"]
    method(["Runs the model once and writes every output into the given buffers.", "",
            *param_docs, *(f"@param {t.ident} receives output {_describe(t)}" for t in outputs), *throws_run],
           f"public void run({', '.join(p for p in (in_params, out_params) if p)})",
           [f"model.run(new Buffer[] {{{in_array}}}, new Buffer[] {{{out_array}}});"])
    method(["Runs the model once and returns its outputs in new direct buffers.", "",
            *param_docs, "@return the outputs", *throws_run],
           f"public Outputs run({in_params})",
           ["synchronized (model) {",
            f"  model.run(new Buffer[] {{{in_array}}});",
            f"  Outputs out = new Outputs({', '.join(f'{t.allocator}()' for t in outputs)});",
            *(f"  model.getOutput({t.index}, out.{t.ident});" for t in outputs),
            "  return out;",
            "}"])
    method(["Returns the generic model: introspection, raw buffers, single inputs.", "",
            "@return the underlying model (closed with this one)"],
           "public NativeModel nativeModel()", ["return model;"])
    method(["Releases the native model. Calling it again does nothing."],
           "@Override\n  public void close()", ["model.close();"])
    add("")
    add("  /** The outputs of one run, in new buffers (see {@link #run(" +
        ", ".join(t.buffer_type for t in inputs) + ")}). */")
    add("  public static final class Outputs {")
    for t in outputs:
        add(f"    /** Output {_describe(t)}. */")
        add(f"    public final {t.buffer_type} {t.ident};")
        add("")
    add(f"    private Outputs({out_params}) {{")
    for t in outputs:
        add(f"      this.{t.ident} = {t.ident};")
    add("    }")
    add("  }")
    add("}")
    return "\n".join(lines) + "\n"


NATIVE_ALIGNMENT = 64  # NativeModel.ALIGNMENT, EP_ALIGNMENT


def generate_java_sources(manifest: BuildManifest, java_package: str, class_name: str) -> dict[str, str]:
    """Every Java source of the model's API, by path relative to the source root: the core
    (``ai/edgepack/*.java``) and ``<package path>/<class_name>.java`` generated from the manifest."""
    sources = core_java_sources()
    sources[f"{java_package.replace('.', '/')}/{class_name}.java"] = generate_model_class(
        manifest, java_package, class_name)
    return sources


# ----------------------------------------------------------------------------------------------
# Java tools


def _java_tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).is_file():
        return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if not found:
        raise ToolchainError(f"The Java tool {name} is not installed (needed to build the Java API).",
                             "Install a JDK 11 or newer: `apt-get install openjdk-17-jdk-headless`"
                             " (or set JAVA_HOME).")
    return found


def jdk_include_dirs() -> tuple[Path, ...]:
    """``<jdk>/include`` and ``<jdk>/include/linux`` (jni.h, jni_md.h) of the JDK providing javac."""
    home = Path(os.path.realpath(_java_tool("javac"))).parent.parent
    include = home / "include"
    if not (include / "jni.h").is_file():
        raise ToolchainError(f"The JDK at {home} has no include/jni.h.",
                             "Install a full JDK (openjdk-17-jdk-headless), not only a JRE.")
    return (include, include / "linux")


def compile_java(
    sources: Mapping[str, str] | Iterable[Path],
    out_dir: Path,
    classpath: Sequence[Path] = (),
    *,
    release: str = JAVA_RELEASE,
    werror: bool = False,
    log: Progress | None = None,
) -> Path:
    """Compile Java sources with the real ``javac --release 8`` into ``out_dir`` (returned).

    ``sources`` is either a mapping of relative path -> text (written to a temp tree) or files.
    """
    javac = _java_tool("javac")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgepack-java-") as tmp:
        if isinstance(sources, Mapping):
            files = []
            for rel, text in sources.items():
                path = Path(tmp) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                files.append(path)
        else:
            files = [Path(p) for p in sources]
        cmd = [javac, "--release", release, "-encoding", "UTF-8", "-Xlint:all", "-Xlint:-options",
               *(["-Werror"] if werror else []), "-d", str(out_dir)]
        if classpath:
            cmd += ["-cp", os.pathsep.join(str(p) for p in classpath)]
        cmd += [str(f) for f in files]
        if log:
            log("$ " + " ".join(cmd[:12]) + (" ..." if len(cmd) > 12 else ""))
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ToolchainError("Compiling the Java API with javac failed.",
                             "The compiler said:\n" + "\n".join((result.stderr + result.stdout).strip().splitlines()[-25:]))
    return out_dir


def make_jar(classes_dir: Path, jar_path: Path, *, packages: Sequence[str] | None = None) -> Path:
    """A jar of the ``.class`` files under ``classes_dir`` (only ``packages`` when given), written
    deterministically with Python's zipfile."""
    classes_dir, jar_path = Path(classes_dir), Path(jar_path)
    prefixes = tuple(p.replace(".", "/") + "/" for p in packages) if packages else None
    entries = sorted(p for p in classes_dir.rglob("*.class")
                     if prefixes is None or p.relative_to(classes_dir).as_posix().startswith(prefixes))
    jar_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = jar_path.with_name(f".{jar_path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as jar:
        _zip_write(jar, "META-INF/MANIFEST.MF", f"Manifest-Version: 1.0\r\nCreated-By: edgepack {__version__}\r\n\r\n")
        for path in entries:
            _zip_write(jar, path.relative_to(classes_dir).as_posix(), path.read_bytes())
    tmp.replace(jar_path)
    return jar_path


def _zip_write(z: zipfile.ZipFile, name: str, data: bytes | str) -> None:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    z.writestr(info, data)


def find_android_jar() -> Path | None:
    """``platforms/android-<N>/android.jar`` of the SDK in ``$ANDROID_HOME``/``$ANDROID_SDK_ROOT``."""
    for var in ("ANDROID_HOME", "ANDROID_SDK_ROOT"):
        root = os.environ.get(var)
        if not root:
            continue
        jars = list(Path(root).expanduser().glob("platforms/android-*/android.jar"))
        numbered = [(int(m.group(1)), j) for j in jars if (m := re.fullmatch(r"android-(\d+)", j.parent.name))]
        if numbered:
            return max(numbered)[1]
    return None


def compile_java_api(sources: Mapping[str, str], work: Path, *, android_jar: Path | None = None,
                     log: Progress | None = None) -> tuple[Path, Path]:
    """Compile the API against ``android_jar`` (else edgepack's stubs of the few Android classes it
    uses) into ``work/classes``; returns (classes dir, classpath entry used)."""
    work = Path(work)
    if android_jar is None:
        classpath = compile_java(android_stub_sources(), work / "android-stubs", log=log)
    else:
        classpath = Path(android_jar)
    return compile_java(sources, work / "classes", [classpath], log=log), classpath


# ----------------------------------------------------------------------------------------------
# ELF


@dataclass(frozen=True)
class ElfInfo:
    machine: int
    elf_class: int  # 1: 32-bit, 2: 64-bit
    elf_type: int  # 3: ET_DYN
    needed: tuple[str, ...]
    soname: str | None
    min_load_align: int  # smallest p_align of the PT_LOAD segments (16 KiB pages need >= 16384)


def read_elf(path: Path) -> ElfInfo:
    """Machine, class, type, DT_NEEDED, DT_SONAME and LOAD alignment of an ELF file (little endian)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        raise EdgepackError(f"{path} is not an ELF file.", "Only shared libraries (.so) can go into jni/<abi>/.")
    elf_class, endian = data[4], data[5]
    if endian != 1:
        raise EdgepackError(f"{path} is a big-endian ELF file; Android ABIs are little endian.")
    if elf_class == 2:
        e_type, e_machine = struct.unpack_from("<HH", data, 16)
        e_phoff, = struct.unpack_from("<Q", data, 32)
        e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
        ph_fmt, dyn_fmt, dyn_size = "<IIQQQQQQ", "<qQ", 16
    else:
        e_type, e_machine = struct.unpack_from("<HH", data, 16)
        e_phoff, = struct.unpack_from("<I", data, 28)
        e_phentsize, e_phnum = struct.unpack_from("<HH", data, 42)
        ph_fmt, dyn_fmt, dyn_size = "<IIIIIIII", "<iI", 8
    loads, dynamic = [], None
    for i in range(e_phnum):
        fields = struct.unpack_from(ph_fmt, data, e_phoff + i * e_phentsize)
        if elf_class == 2:
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, p_align = fields
        else:
            p_type, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _flags, p_align = fields
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz, p_align))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)

    def file_offset(vaddr: int) -> int | None:
        for v, off, size, _align in loads:
            if v <= vaddr < v + max(size, 1):
                return vaddr - v + off
        return None

    needed_offsets, soname_offset, strtab = [], None, None
    if dynamic is not None:
        off, size = dynamic
        for pos in range(off, off + size, dyn_size):
            tag, value = struct.unpack_from(dyn_fmt, data, pos)
            if tag == 0:
                break
            if tag == 1:
                needed_offsets.append(value)
            elif tag == 14:
                soname_offset = value
            elif tag == 5:
                strtab = file_offset(value)

    def string(at: int) -> str:
        end = data.index(b"\0", strtab + at)
        return data[strtab + at:end].decode("utf-8", "replace")

    needed = tuple(string(o) for o in needed_offsets) if strtab is not None else ()
    soname = string(soname_offset) if strtab is not None and soname_offset is not None else None
    return ElfInfo(e_machine, elf_class, e_type, needed, soname, min((a for *_, a in loads), default=0))


def _machine_name(machine: int) -> str:
    return _MACHINE_NAMES.get(machine, f"e_machine {machine}")


def check_abi_library(abi: str, path: Path) -> ElfInfo:
    """Refuse a library whose name is not ``lib*.so`` or whose ELF machine/class/type does not
    match the ABI directory it goes into."""
    path = Path(path)
    if not (path.name.startswith("lib") and path.name.endswith(".so")):
        raise EdgepackError(f"{path.name} is not named lib*.so; Android only installs such files from jni/<abi>/.",
                            "Rename the library.")
    return check_elf_for_abi(abi, path)


def check_elf_for_abi(abi: str, path: Path) -> ElfInfo:
    """Refuse a file that is not a shared library for ``abi`` (ELF machine, class and type)."""
    if abi not in ABI_MACHINES:
        raise EdgepackError(f"Unknown Android ABI {abi!r}.", "Use one of: " + ", ".join(ABI_MACHINES) + ".")
    path = Path(path)
    info = read_elf(path)
    machine, elf_class = ABI_MACHINES[abi]
    if info.machine != machine or info.elf_class != elf_class:
        raise EdgepackError(
            f"{path} is built for {_machine_name(info.machine)}, {32 if info.elf_class == 1 else 64}-bit; "
            f"jni/{abi}/ needs {_machine_name(machine)}, {32 if elf_class == 1 else 64}-bit.",
            "Build the library for that ABI with the Android NDK (edgepack package android --abi ...).",
        )
    if info.elf_type != 3:
        raise EdgepackError(f"{path} is not a shared library (ELF type {info.elf_type}).",
                            "Only shared libraries (.so) can go into an AAR.")
    return info


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
    from edgepack.native import runtimes_dir

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not shutil.which(cc):
        raise ToolchainError(f"The C compiler {cc} is not installed.", "Install it or pass its full path.")
    if len(runtime.shared_libs) != 2:
        raise ToolchainError(f"The {runtime.triple} runtime in {runtime.root} has no shared libraries.")
    c_dir = runtimes_dir() / "c"
    flags = list(cflags) if cflags is not None else list(runtime.cflags)
    cmd: list[str] = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", *(["-Werror"] if werror else []), "-fPIC",
                      "-fvisibility=hidden", *flags, "-I", str(c_dir / "include")]
    for inc in (*runtime.include_dirs, *jni_include_dirs):
        cmd += ["-I", str(inc)]
    cmd += [str(android_sources_dir() / "jni" / "edgepack_jni.c"), str(c_dir / "src" / "edgepack.c")]
    lib_dirs = list(dict.fromkeys(str(p.parent) for p in runtime.shared_libs))
    cmd += ["-shared", f"-Wl,-soname,{JNI_LIBRARY}", "-Wl,--no-undefined", *(f"-L{d}" for d in lib_dirs),
            "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi", "-Wl,--as-needed", "-ldl", "-lm"]
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
    """``runtimes/android/templates/<name>`` with its ``@key@`` placeholders filled in."""
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
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as aar:
            _zip_write(aar, "AndroidManifest.xml", manifest)
            _zip_write(aar, "classes.jar", Path(classes_jar).read_bytes())
            _zip_write(aar, "R.txt", "")
            if proguard is not None:
                _zip_write(aar, "proguard.txt", proguard)
            for name, lib in checked:
                _zip_write(aar, name, lib.read_bytes())
        tmp.replace(out_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out_path


# ----------------------------------------------------------------------------------------------
# the Gradle module and the package directory


@dataclass(frozen=True)
class AbiLibraries:
    """The native libraries of one ABI, by role."""

    jni: Path  # libedgepack_jni.so
    runtime: tuple[Path, ...]  # libtvm_ffi.so, libtvm_runtime.so
    model: Path  # the model library (any name; copied as model_library_name(class))
    extra: tuple[Path, ...] = ()  # e.g. libc++_shared.so

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
    from edgepack.native import runtimes_dir

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
    shutil.copy2(runtimes_dir() / "c" / "src" / "edgepack.c", cpp / "edgepack.c")
    shutil.copy2(runtimes_dir() / "c" / "include" / "edgepack.h", cpp / "include" / "edgepack.h")
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
    io = "\n".join([*(f"| input | `{t.name}` | {t.dtype} | {list(t.shape)} | `{cls}.{t.allocator}()` |" for t in inputs),
                    *(f"| output | `{t.name}` | {t.dtype} | {list(t.shape)} | `{cls}.{t.allocator}()` |" for t in outputs)])
    java_in = "\n".join(f"    {t.buffer_type} {t.ident} = {cls}.{t.allocator}();   // fill it" for t in inputs)
    kt_in = "\n".join(f"    val {t.ident} = {cls}.{t.allocator}()   // fill it" for t in inputs)
    args = ", ".join(t.ident for t in inputs)
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
    val out = model.run({args})
}}
```

| | tensor | dtype | shape | buffer |
| --- | --- | --- | --- | --- |
{io}

Buffers are direct NIO buffers in native byte order (the `new...Buffer()` methods make them 64-byte aligned,
so inputs are read in place, without a copy). Errors are `ai.edgepack.EdgepackException` with the native
runtime's message. `run(inputs..., outputs...)` writes into buffers you keep and reuse.

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


# ----------------------------------------------------------------------------------------------
# the NDK


@dataclass(frozen=True)
class Ndk:
    bin_dir: Path  # toolchains/llvm/prebuilt/<host>/bin
    api_level: int
    primary_cc: str  # the compilers find_compilers found for the build's profile
    primary_cxx: str

    @property
    def sysroot(self) -> Path:
        return self.bin_dir.parent / "sysroot"

    def compilers(self, abi: AbiSpec, primary: bool) -> tuple[str, str]:
        """The C and C++ compilers for ``abi``; ``primary``: those found for the build's profile."""
        if primary:
            return self.primary_cc, self.primary_cxx
        cc = self.bin_dir / f"{abi.triple}{self.api_level}-clang"
        cxx = self.bin_dir / f"{abi.triple}{self.api_level}-clang++"
        if not cc.exists() or not cxx.exists():
            raise ToolchainError(f"The NDK in {self.bin_dir.parent.parent.parent.parent} has no {cc.name} for {abi.name}.",
                                 "Pass the NDK root with --ndk (TVM_NDK_CC only names the arm64 compiler).")
        return str(cc), str(cxx)


def _c_compiler(cxx: str) -> str:
    """The C compiler beside a C++ one (TVM_NDK_CC names the C++ compiler only)."""
    for plus, plain in (("clang++", "clang"), ("g++", "gcc")):
        if cxx.endswith(plus):
            found = shutil.which(cxx[: -len(plus)] + plain)
            if found:
                return found
    return cxx


def find_ndk(profile: Any, ndk: str | None) -> Ndk:
    """The NDK clang of ``profile`` (``--ndk``, ``$ANDROID_NDK_HOME``, ``$ANDROID_NDK_ROOT`` or
    ``$TVM_NDK_CC``), or a ToolchainError telling how to provide it."""
    from edgepack.toolchain import find_compilers

    try:
        compilers = find_compilers(profile, ndk=ndk)
    except ToolchainError as exc:
        given = ndk or os.environ.get("ANDROID_NDK_HOME") or os.environ.get("ANDROID_NDK_ROOT")
        where = (f"No NDK clang ({profile.toolchain.cxx}) was found under {given}." if given else
                 "No Android NDK was given: --ndk is missing and ANDROID_NDK_HOME, ANDROID_NDK_ROOT and"
                 " TVM_NDK_CC are not set.")
        raise ToolchainError(
            "`edgepack package android` needs the Android NDK: its clang builds the JNI layer and the TVM"
            f" runtime for Android, and edgepack never puts a non-Android library into an AAR. {where}",
            "Install the NDK (r26 or newer; Android Studio > SDK Manager > SDK Tools > NDK, or"
            " https://developer.android.com/ndk/downloads) and pass --ndk /path/to/android-ndk-r27c, or"
            " export ANDROID_NDK_HOME=/path/to/android-ndk-r27c, or set TVM_NDK_CC to the full path of"
            f" {profile.toolchain.cxx}.",
        ) from exc
    cxx = compilers.cxx
    cc = compilers.cc if compilers.cc != cxx else _c_compiler(cxx)
    match = re.search(r"(\d+)-clang", Path(cxx).name)
    return Ndk(bin_dir=Path(os.path.realpath(cxx)).parent, api_level=int(match.group(1)) if match else MIN_SDK,
               primary_cc=cc, primary_cxx=cxx)


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
    from edgepack import compiler, native
    from edgepack.atomic import atomic_directory, check_output_dir
    from edgepack.importers import import_model
    from edgepack.manifest import read_manifest
    from edgepack.profiles import get_profile, profile_from_dict

    say = progress or (lambda _msg: None)
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
            runtime = native.ensure_target_runtime(abi.triple, cc, cxx, need_static=False,
                                                   extra_flags=abi.runtime_flags or None, log=say)
            runtime_include_dirs = runtime.include_dirs
            if build_abi is abi:
                model_lib = build_dir / manifest.artifacts["device_library"].path
            else:
                say(f"Compiling the model for {abi.name}")
                if imported is None:
                    imported = import_model(build_dir / manifest.model_file,
                                            {t.name: tuple(t.shape) for t in manifest.inputs})
                exe = compiler.build(imported, _tvm_target(abi.tvm_target))
                model_lib = native.export_model_shared(exe, tmp / abi.name / "model.so", cxx, meta_text=meta, cc=cc,
                                                       options=["-s", *abi.runtime_flags], log=None)
            say(f"Building {JNI_LIBRARY} for {abi.name}")
            jni = build_jni_library(runtime, tmp / abi.name / "jni" / JNI_LIBRARY, cc, android=True, strip=True)
            libs = [jni, *runtime.shared_libs, model_lib]
            for lib in libs:
                check_elf_for_abi(abi.name, lib)
            extra = _bundle_dependencies(libs, abi, ndk_tools)
            for lib in (*libs, *extra):
                align = read_elf(lib).min_load_align
                if align < 16384:
                    say(f"Note: {lib.name} ({abi.name}) has {align}-byte LOAD alignment; devices with 16 KiB pages"
                        " (Android 15+) need 16384: use NDK r28 or newer.")
            libraries[abi.name] = AbiLibraries(jni=jni, runtime=runtime.shared_libs, model=model_lib,
                                               extra=tuple(extra))

        say("Compiling the Java API")
        sources = generate_java_sources(manifest, java_package, class_name)
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


def _tvm_target(spec: dict[str, Any]):
    import tvm

    return tvm.target.Target(spec)


def read_package(output_dir: Path | str) -> dict[str, Any]:
    """The manifest.json of a package made by ``package_android``."""
    path = Path(output_dir) / PACKAGE_MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EdgepackError(f"{output_dir} is not an edgepack Android package ({exc}).",
                            "Make one with `edgepack package android BUILD -o DIR --package com.example.app`.") from exc
