"""The Java API of a model: the generic core ``ai.edgepack`` (sources in ``runtimes/api/android/java``) and
a class generated per model in the user's package with the typed names and shapes of its manifest."""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgepack.dims import DimRange, dims_from_dict
from edgepack.errors import EdgepackError
from edgepack.manifest import BuildManifest
from edgepack.processing import ProcessingPlan, manifest_plan
from edgepack.toolchain.sources import ANDROID_API, source_dir
from edgepack.versions import __version__

CORE_PACKAGE = "ai.edgepack"

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
    **{f"float8_{kind}": ("ByteBuffer", None) for kind in ("e4m3fn", "e4m3fnuz", "e5m2", "e5m2fnuz", "e8m0fnu")},
}

# ----------------------------------------------------------------------------------------------
# locations and names


def android_sources_dir() -> Path:
    """``runtimes/api/android`` (JNI C source, Java core, templates, compile-time Android stubs)."""
    return source_dir(ANDROID_API)


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
    shape: tuple[int | str, ...]  # a dynamic input dimension by its name ("W"), an output's run-time extent "?"
    ident: str  # Java identifier: parameter and Outputs field (``input``)
    constant: str  # TensorInfo constant (``INPUT_INPUT``, ``OUTPUT_LOGITS``)
    buffer_type: str  # FloatBuffer, ...
    view_method: str | None  # ByteBuffer method giving that view (None for ByteBuffer)
    ranges: tuple[DimRange | None, ...] = ()  # per axis: the range of a dynamic input dimension

    @property
    def allocator(self) -> str:
        """The static method that allocates a buffer for this tensor (``newInputBuffer``)."""
        return "new" + self.ident[0].upper() + self.ident[1:] + "Buffer"

    @property
    def setter(self) -> str:
        """The method of a dynamic build's class that sets this input (``setX``)."""
        return "set" + self.ident[0].upper() + self.ident[1:]

    @property
    def is_dynamic(self) -> bool:
        """Whether an extent is not fixed: a dynamic input dimension or an output's run-time one."""
        return not all(isinstance(d, int) for d in self.shape)

    @property
    def max_shape(self) -> tuple[int | str, ...]:
        """The shape with each dynamic input dimension at its max (an output's ``?`` stays)."""
        return tuple(r.max if r is not None else d for d, r in zip(self.shape, self.ranges or (None,) * len(self.shape)))

    @property
    def element_count(self) -> int:
        """The number of elements (dynamic input dimensions at their max); -1 with a run-time extent."""
        n = 1
        for d in self.max_shape:
            if not isinstance(d, int):
                return -1
            n *= d
        return n

    @property
    def shape_text(self) -> str:
        """``[1, 3, 224, 224]``; ``[1, 3, 48, W]``, ``[1, ?, 6625]`` for dynamic extents."""
        return "[" + ", ".join(str(d) for d in self.shape) + "]"


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
    dims = dims_from_dict(manifest.dims)
    result: list[list[JavaTensor]] = [[], []]
    for slot, (kind, specs) in enumerate((("input", manifest.inputs), ("output", manifest.outputs))):
        for i, spec in enumerate(specs):
            dtype = str(spec.dtype)
            if dtype not in _JAVA_BUFFERS:
                raise EdgepackError(f"The {kind} {spec.name!r} has dtype {dtype}, which the Java API does not support.",
                                    "Supported: " + ", ".join(sorted(_JAVA_BUFFERS)) + ".")
            # a dynamic build (--dim): inputs name their dims, outputs that follow them are "?" (read per run)
            allowed = set(dims) if kind == "input" else ({"?"} if dims else set())
            if not all((isinstance(d, int) and d >= 0) or (isinstance(d, str) and d in allowed) for d in spec.shape):
                shown = "[" + ", ".join(str(d) for d in spec.shape) + "]"
                if kind == "output":  # "?": decided by the model at run time (NonZero, Unique ...)
                    raise EdgepackError(
                        f"The output {spec.name!r} has dimensions the model decides at run time {shown}; the "
                        "generated Java class needs static shapes.",
                        "Use the C API (`edgepack package c`), which reports each run's output shapes, or "
                        "re-export the model with fixed-size outputs (e.g. padded to a maximum count).")
                raise EdgepackError(f"The {kind} {spec.name!r} has a dynamic shape {shown}.",
                                    "Compile the model with static shapes (--input-shape).")
            shape = tuple(d if isinstance(d, str) else int(d) for d in spec.shape)
            ranges = tuple(dims.get(d) if isinstance(d, str) else None for d in shape)
            buffer_type, view = _JAVA_BUFFERS[dtype]
            result[slot].append(JavaTensor(
                index=i, name=str(spec.name), dtype=dtype, shape=shape,
                ident=_unique(_ident(str(spec.name), f"{kind}{i}"), idents),
                constant=_unique(f"{kind.upper()}_{_constant(str(spec.name), str(i))}", constants),
                buffer_type=buffer_type, view_method=view,
                ranges=ranges if any(r is not None for r in ranges) else ()))
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
    return f"<code>{_doc_text(t.name)}</code>: {t.dtype} {t.shape_text}"


def dim_text(r: DimRange) -> str:
    """``W = 32..1280`` or ``W = 32..1280, step 32`` (Javadoc, README)."""
    return f"{r.name} = {r.min}..{r.max}" + (f", step {r.step}" if r.step != 1 else "")


def dynamic_dims(manifest: BuildManifest) -> list[DimRange]:
    """The build's dynamic input dimensions (``--dim``), in order of first use; empty for a static build."""
    dims = dims_from_dict(manifest.dims)
    return [dims[d] for d in dict.fromkeys(d for s in manifest.inputs for d in s.shape if isinstance(d, str))
            if d in dims]


def generate_model_class(manifest: BuildManifest, java_package: str, class_name: str,
                         runtime_libraries: Sequence[str] = ()) -> str:
    """The Java source of the per-model class (see ``generate_java_sources``)."""
    check_java_package(java_package)
    check_class_name(class_name)
    inputs, outputs = java_tensors(manifest)
    cls = class_name
    buffer_types = sorted({t.buffer_type for t in (*inputs, *outputs)} | {"ByteBuffer"})
    lines: list[str] = []
    add = lines.append
    plan = manifest_plan(manifest)
    frame = _single_frame(plan, inputs)
    bitmap = frame is not None and frame.setting.format != "nv21"
    dims = dynamic_dims(manifest)  # a dynamic build: setters with shapes, outputs sized by each run
    taken = {"LIBRARY_FILE", "MODEL_SHA256", "INPUTS", "OUTPUTS", *(t.constant for t in (*inputs, *outputs))}
    dim_constants = {r.name: _unique(f"DIM_{_constant(r.name, 'dim')}", taken) for r in dims}
    names = {"model", "out", *(t.ident for t in (*inputs, *outputs))}
    shape_params = {t.index: _unique(t.ident + "Shape", names) for t in inputs if t.is_dynamic}
    shape_fields = {t.index: _unique(t.ident + "Shape", names) for t in outputs} if dims else {}

    def processed(t: JavaTensor) -> str:
        """What a processed input or output is, for its Javadoc (empty for the model's own tensors)."""
        text = plan.describe(t.name) if plan else None
        return f" &mdash; {_doc_text(text)}" if text else ""

    add(f"// Generated by edgepack {__version__} from {Path(manifest.model_source).name}"
        f" (sha256 {manifest.model_sha256[:16]}...). Do not edit: run `edgepack package android` again.")
    add(f"package {java_package};")
    add("")
    for imp in ("ai.edgepack.AndroidLibraries", "ai.edgepack.DType", "ai.edgepack.EdgepackException",
                *(("ai.edgepack.Frames",) if bitmap else ()),
                "ai.edgepack.NativeModel", "ai.edgepack.TensorInfo", "android.content.Context",
                *(("android.graphics.Bitmap",) if bitmap else ()), "java.io.File",
                "java.nio.Buffer", *(f"java.nio.{b}" for b in buffer_types), "java.util.Arrays",
                "java.util.Collections", "java.util.List"):
        add(f"import {imp};")
    add("")
    add("/**")
    add(f" * The model <code>{_doc_text(model_name_of(manifest))}</code> compiled by edgepack (Apache TVM) for"
        " Android CPUs.")
    add(" *")
    if plan is not None:
        add(" * <p>Pre- and post-processing are compiled into the model: it takes camera frames and gives answers.")
        add(" *")
    add(" * <p>Inputs:")
    add(" * <ul>")
    for t in inputs:
        add(f" *   <li>{_describe(t)}{processed(t)}</li>")
    add(" * </ul>")
    add(" * <p>Outputs:")
    add(" * <ul>")
    for t in outputs:
        add(f" *   <li>{_describe(t)}{processed(t)}</li>")
    add(" * </ul>")
    if dims:
        add(" * <p>Dynamic dimensions: the model runs at every size in these ranges (one build, compiled with")
        add(" * <code>--dim</code>); outputs marked <code>?</code> have the extents each run gives them.")
        add(" * <ul>")
        for r in dims:
            add(f" *   <li>{_doc_text(dim_text(r))} ({{@link #{dim_constants[r.name]}}})</li>")
        add(" * </ul>")
    add(" *")
    add(" * <pre>{@code")
    add(f" * try ({cls} model = {cls}.load(context)) {{")
    for t in inputs:
        what = f"room for {t.element_count} values, the largest size" if t.is_dynamic else f"fill {t.element_count} values"
        add(f" *   {t.buffer_type} {t.ident} = {cls}.{t.allocator}();  // {what}")
    if dims:
        example = ", ".join(
            t.ident + (", new long[] {" + ", ".join(str(d).lower() for d in t.shape) + "}" if t.is_dynamic else "")
            for t in inputs)
        add(f" *   {cls}.Outputs out = model.run({example});  // {', '.join(dim_text(r) for r in dims)}")
        add(f" *   // read out.{outputs[0].ident}, of shape out.{shape_fields[0]}")
    else:
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
    for r in dims:
        add("")
        add(f"  /** Dynamic dimension {_doc_text(dim_text(r))}. */")
        add(f"  public static final TensorInfo.Dim {dim_constants[r.name]} =")
        add(f"      new TensorInfo.Dim({_java_string(r.name)}, {r.min}L, {r.max}L, {r.step}L);")
    for kind, tensors in (("Input", inputs), ("Output", outputs)):
        for t in tensors:
            extents = ", ".join(f"{d}L" if isinstance(d, int) else "-1L" for d in t.shape)
            ranges = ""
            if t.ranges:
                ranges = ", new TensorInfo.Dim[] {" + ", ".join(
                    dim_constants[r.name] if r is not None else "null" for r in t.ranges) + "}"
            doc = f"{kind} {t.index} {_describe(t)}"
            if t.ranges:
                doc += " with " + ", ".join(dict.fromkeys(_doc_text(dim_text(r)) for r in t.ranges if r is not None))
            add("")
            add(f"  /** {doc}. */")
            add(f"  public static final TensorInfo {t.constant} =")
            add(f"      new TensorInfo({_java_string(t.name)}, DType.{t.dtype.upper()}, new long[] {{{extents}}}"
                f"{ranges});")
    if frame is not None:
        add("")
        add(f"  /** Format of the camera frames input {frame.name!r} takes ({_doc_text(frame.setting.format)}). */")
        add(f"  public static final String FRAME_FORMAT = {_java_string(frame.setting.format)};")
        if frame.dynamic:  # frames of any size in the ranges of its dims (DIM_... constants)
            add("")
            add(f"  /** Channels of the frames (their size changes: {_doc_text(frame.describe().split(';')[0])}). */")
            add(f"  public static final int FRAME_CHANNELS = {frame.frame.shape[-1]};")
        else:
            add("")
            add("  /** Height of the frames in pixels. */")
            add(f"  public static final int FRAME_HEIGHT = {frame.frame_height};")
            add("")
            add("  /** Width of the frames in pixels. */")
            add(f"  public static final int FRAME_WIDTH = {frame.frame_width};")
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
           # the backend's runtime plug-ins must sit beside the model file: the C API loads them from there
           [*(f"AndroidLibraries.find(context, {_java_string(name)});" for name in runtime_libraries),
            "return wrap(NativeModel.open(AndroidLibraries.find(context, LIBRARY_FILE)));"])
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
            if kind == "output" and t.is_dynamic:
                continue  # its size is the run's: Outputs holds it, or NativeModel.getOutput(index)
            if t.is_dynamic:
                method([f"Allocates a buffer for {kind} {_describe(t)} at its largest size, {list(t.max_shape)}:",
                        f"{t.element_count} values, direct, {NATIVE_ALIGNMENT}-byte aligned, native byte order. It takes the",
                        "values of any smaller size too (from position 0).", "",
                        f"@return a new buffer with position 0 and limit {t.element_count}"],
                       f"public static {t.buffer_type} {t.allocator}()",
                       [f"return NativeModel.allocate({t.constant}.byteSize()){view};"])
                method([f"Allocates a buffer for {kind} {_describe(t)} at one size: direct,",
                        f"{NATIVE_ALIGNMENT}-byte aligned, native byte order.", "",
                        "@param shape the extents, e.g. {@code new long[] {"
                        + ", ".join(str(d) for d in t.max_shape) + "}}",
                        "@return a new buffer with position 0 and limit the product of the extents"],
                       f"public static {t.buffer_type} {t.allocator}(long[] shape)",
                       [f"return NativeModel.allocate({t.constant}.byteSize(shape)){view};"])
                continue
            method([f"Allocates a buffer for {kind} {_describe(t)}: {t.element_count} values, direct,",
                    f"{NATIVE_ALIGNMENT}-byte aligned, native byte order.", "",
                    f"@return a new buffer with position 0 and limit {t.element_count}"],
                   f"public static {t.buffer_type} {t.allocator}()",
                   [f"return NativeModel.allocate({t.constant}.byteSize()){view};"])

    if dims:
        _dynamic_run_methods(method, inputs, outputs, shape_params, shape_fields)
    else:
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
    if bitmap and frame.dynamic:
        method(["Runs the model on an Android bitmap of any size in the frame's ranges: its pixels become a "
                + _doc_text(frame.setting.format) + " frame",
                "(see {@link Frames#fromBitmap}) of its size, which the model converts, resizes and normalises itself.",
                "",
                "@param bitmap the picture",
                "@return the outputs", ("@throws EdgepackException with the native message, or (status SHAPE) for "
                                        "a bitmap outside the ranges")],
               "public Outputs run(Bitmap bitmap)",
               ["long[] shape = {bitmap.getHeight(), bitmap.getWidth(), FRAME_CHANNELS};",
                f"ByteBuffer frame = {inputs[0].allocator}(shape);",
                "Frames.fromBitmap(bitmap, FRAME_FORMAT, bitmap.getHeight(), bitmap.getWidth(), frame);",
                "return run(frame, shape);"])
    elif bitmap:
        method(["Runs the model on an Android bitmap: its pixels become a " + _doc_text(frame.setting.format)
                + " frame (see {@link Frames#fromBitmap}),",
                "which the model converts, resizes and normalises itself.", "",
                "@param bitmap a FRAME_WIDTH x FRAME_HEIGHT bitmap",
                "@return the outputs", ("@throws EdgepackException with the native message, or (status SHAPE) for "
                                        "a bitmap of another size")],
               "public Outputs run(Bitmap bitmap)",
               [f"ByteBuffer frame = {inputs[0].allocator}();",
                "Frames.fromBitmap(bitmap, FRAME_FORMAT, FRAME_HEIGHT, FRAME_WIDTH, frame);",
                "return run(frame);"])
    method(["Returns the generic model: introspection, raw buffers, single inputs.", "",
            "@return the underlying model (closed with this one)"],
           "public NativeModel nativeModel()", ["return model;"])
    method(["Releases the native model. Calling it again does nothing."],
           "@Override\n  public void close()", ["model.close();"])
    add("")
    run_types = ", ".join(t.buffer_type + (", long[]" if t.index in shape_params else "") for t in inputs)
    add("  /** The outputs of one run, in new buffers (see {@link #run(" + run_types + ")}). */")
    add("  public static final class Outputs {")
    for t in outputs:
        add(f"    /** Output {_describe(t)}. */")
        add(f"    public final {t.buffer_type} {t.ident};")
        add("")
        if t.index in shape_fields:
            add(f"    /** The shape output <code>{_doc_text(t.name)}</code> had in this run. */")
            add(f"    public final long[] {shape_fields[t.index]};")
            add("")
    fields = [f"{t.buffer_type} {t.ident}" + (f", long[] {shape_fields[t.index]}" if t.index in shape_fields else "")
              for t in outputs]
    add(f"    private Outputs({', '.join(fields)}) {{")
    for t in outputs:
        add(f"      this.{t.ident} = {t.ident};")
        if t.index in shape_fields:
            add(f"      this.{shape_fields[t.index]} = {shape_fields[t.index]};")
    add("    }")
    add("  }")
    add("}")
    return "\n".join(lines) + "\n"


def _dynamic_run_methods(method, inputs: Sequence[JavaTensor], outputs: Sequence[JavaTensor],
                         shape_params: dict[int, str], shape_fields: dict[int, str]) -> None:
    """A dynamic build's setters (one per input; a dynamic input's takes the data's shape), ``run()`` on the
    inputs set and ``run(inputs with shapes)``, both returning the outputs at the sizes the run produced."""
    throws_shape = ["@throws EdgepackException (status SHAPE) with the native message for a size out of its",
                    "    dimension's range or off its step (naming the dimension and its range), or a buffer with",
                    "    fewer values than the shape; with the native message for a closed model"]
    for t in inputs:
        if t.index in shape_params:
            ranges = ", ".join(dict.fromkeys(_doc_text(dim_text(r)) for r in t.ranges if r is not None))
            method([f"Sets input {_describe(t)} to values of the given shape ({ranges});",
                    "the next run runs at that size. A direct buffer is read in place during the run.", "",
                    f"@param {t.ident} the values, row-major, from the buffer's position",
                    "@param shape the extents of the values, e.g. {@code new long[] {"
                    + ", ".join(str(d) for d in t.max_shape) + "}}",
                    *throws_shape],
                   f"public void {t.setter}({t.buffer_type} {t.ident}, long[] shape)",
                   [f"model.setInput({t.index}, {t.ident}, shape);"])
        else:
            method([f"Sets input {_describe(t)}. A direct buffer is read in place during the run.", "",
                    f"@param {t.ident} the values, row-major, from the buffer's position",
                    "@throws EdgepackException with the native message (wrong buffer size, closed model)"],
                   f"public void {t.setter}({t.buffer_type} {t.ident})",
                   [f"model.setInput({t.index}, {t.ident});"])

    def read(t: JavaTensor) -> str:
        view = f".{t.view_method}()" if t.view_method else ""
        return f"model.getOutput({t.index}){view}, model.outputShape({t.index})"

    throws_run = ["@throws EdgepackException with the native message (an input not set, inputs that disagree on",
                  "    a shared dimension, closed model, runtime failure)"]
    method(["Runs the model once on the inputs set (see the <code>set...</code> methods) and returns its",
            "outputs in new direct buffers, as large as this run produced them.", "",
            "@return the outputs and their shapes", *throws_run],
           "public Outputs run()",
           ["synchronized (model) {",
            "  model.run();",
            "  return new Outputs(",
            *(f"      {read(t)}{',' if n + 1 < len(outputs) else ');'}" for n, t in enumerate(outputs)),
            "}"])
    params, docs = [], []
    for t in inputs:
        params.append(f"{t.buffer_type} {t.ident}")
        docs.append(f"@param {t.ident} input {_describe(t)}")
        if t.index in shape_params:
            params.append(f"long[] {shape_params[t.index]}")
            docs.append(f"@param {shape_params[t.index]} the shape of <code>{t.ident}</code>'s values")
    method(["Sets the inputs (dynamic ones with the shape of their values), runs the model once and",
            "returns its outputs in new direct buffers, as large as this run produced them.", "",
            *docs, "@return the outputs and their shapes", *throws_shape[:-1],
            "    fewer values than the shape; with the native message for a closed model or a runtime failure"],
           f"public Outputs run({', '.join(params)})",
           ["synchronized (model) {",
            *(f"  {t.setter}({t.ident}" + (f", {shape_params[t.index]}" if t.index in shape_params else "") + ");"
              for t in inputs),
            "  return run();",
            "}"])


NATIVE_ALIGNMENT = 64  # NativeModel.ALIGNMENT, EP_ALIGNMENT


def takes_bitmaps(manifest: BuildManifest) -> bool:
    """Whether the generated class has ``run(Bitmap)``: one input, fed with rgb8/bgr8/rgba8/gray8 frames."""
    frame = _single_frame(manifest_plan(manifest), java_tensors(manifest)[0])
    return frame is not None and frame.setting.format != "nv21"


def _single_frame(plan: ProcessingPlan | None, inputs: Sequence[JavaTensor]):
    """The frame input of a model whose only input takes camera frames (FRAME_* constants, run(Bitmap))."""
    if plan is None or len(inputs) != 1 or len(plan.frames) != 1:
        return None
    return plan.frames[0]


def generate_java_sources(manifest: BuildManifest, java_package: str, class_name: str,
                          runtime_libraries: Sequence[str] = ()) -> dict[str, str]:
    """Every Java source of the model's API, by path relative to the source root: the core
    (``ai/edgepack/*.java``) and ``<package path>/<class_name>.java`` generated from the manifest.
    ``runtime_libraries``: plug-ins (``libtvm_opencl.so``) the model needs beside its library."""
    sources = core_java_sources()
    sources[f"{java_package.replace('.', '/')}/{class_name}.java"] = generate_model_class(
        manifest, java_package, class_name, runtime_libraries)
    return sources


