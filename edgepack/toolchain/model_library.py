"""Model libraries for the device: the compiled model as a shared library (``model.so``) or a static
archive (``libmodel.a``), each with the metadata text the C API reads (names, dtypes, shapes) embedded."""

from __future__ import annotations

import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack.errors import EdgepackError, ToolchainError
from edgepack.files import write_text_atomic
from edgepack.progress import Progress
from edgepack.toolchain.compilers import archiver, c_compiler_for
from edgepack.toolchain.packed_kernels import Packed, packing
from edgepack.toolchain.process import run, tail


@dataclass(frozen=True)
class TensorMeta:
    """One model input or output as the C API sees it.

    ``shape`` holds ints; an input's dimension may instead be the name of a dynamic dimension
    (``"W"``, declared with a range in the metadata's ``dim`` lines) and an output's ``"?"``."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


def _meta_name(name: str) -> str:
    """Percent-encode what would break the whitespace-separated format (see edgepack.h)."""
    out = []
    for byte in name.encode("utf-8"):
        out.append(chr(byte) if 0x21 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}")
    return "".join(out)


_META_DTYPES = {"float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64",
                "uint8", "uint16", "uint32", "uint64", "bool",
                "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"}


#: An output dimension the model decides at run time (NonZero, Unique ...): "?" in the metadata.
RUNTIME_DIM = "?"

#: What a dynamic dimension may be called in the metadata (``dim W 32 1280 8``).
_DIM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

#: As many dynamic dimensions as the C API takes (EP_MAX_DIMS in edgepack.c).
MAX_DIMS = 32

#: A dynamic input dimension's range: (min, max, step); the model takes min, min+step, ... max.
DimRange = tuple[int, int, int]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_dims(dims: dict[str, Any] | None) -> dict[str, DimRange]:
    """Validated copy of ``dims`` (name -> (min, max, step)); raises EdgepackError."""
    checked: dict[str, DimRange] = {}
    for name, spec in (dims or {}).items():
        if not isinstance(name, str) or not _DIM_NAME.match(name):
            raise EdgepackError(f"The dynamic dimension name {name!r} is not an identifier.",
                                "Name dynamic dimensions like identifiers: letters, digits and '_', "
                                "not starting with a digit (e.g. W, seq_len).")
        try:
            lo, hi, step = spec
        except (TypeError, ValueError):
            raise EdgepackError(f"The range of dynamic dimension {name} is {spec!r}, not (min, max, step).",
                                "Give each dynamic dimension a range such as W=32..1280:8.") from None
        if not (_is_int(lo) and _is_int(hi) and _is_int(step)):
            raise EdgepackError(f"The range of dynamic dimension {name} is {spec!r}; min, max and step "
                                "must be integers.", "Give each dynamic dimension a range such as W=32..1280:8.")
        if not 1 <= lo <= hi:
            raise EdgepackError(f"Dynamic dimension {name} has the range {lo}..{hi}; it needs 1 <= min <= max.",
                                f"Give {name} a range such as {name}=1..{max(lo, hi, 1)}.")
        if step < 1 or (hi - lo) % step != 0:
            raise EdgepackError(f"Dynamic dimension {name} has the range {lo}..{hi} in steps of {step}; "
                                "the step must be at least 1 and max - min a multiple of it.",
                                f"Give {name} a step >= 1 and a max of min + k*step"
                                + (f" (e.g. {name}={lo}..{lo + step * ((hi - lo) // step)}:{step})." if step >= 1 else "."))
        checked[name] = (lo, hi, step)
    if len(checked) > MAX_DIMS:
        raise EdgepackError(f"The model has {len(checked)} dynamic dimensions; the C runtime takes at most {MAX_DIMS}.",
                            "Fix some of them to a number.")
    return checked


def _as_meta(t: Any, output: bool = False, dim_names: Iterable[str] = ()) -> TensorMeta:
    if isinstance(t, TensorMeta):
        name, dtype, shape = t.name, t.dtype, t.shape
    elif isinstance(t, tuple | list) and len(t) == 3:
        name, dtype, shape = t
    else:
        name, dtype, shape = t.name, t.dtype, t.shape
    dims = tuple(shape)
    named = set(dim_names)
    for d in dims:
        if (_is_int(d) and d >= 0) or (output and d == RUNTIME_DIM) or (not output and isinstance(d, str) and d in named):
            continue
        if output:
            fix = ("Output dimensions that are not a fixed number are written as '?' (decided at run time).")
        elif isinstance(d, str) and d != RUNTIME_DIM:
            fix = (f"Declare the range of {d} (e.g. --dim {d}=MIN..MAX:STEP) or pass a concrete input shape "
                   "when compiling.")
        else:
            fix = "The C runtime needs static input shapes or named dynamic dimensions with a range."
        raise EdgepackError(f"Tensor {name!r} has a dynamic or invalid shape {dims}.", fix)
    if str(dtype) not in _META_DTYPES:
        raise EdgepackError(f"Tensor {name!r} has dtype {dtype}, which the C runtime does not support.",
                            "Supported: " + ", ".join(sorted(_META_DTYPES)) + ".")
    return TensorMeta(str(name), str(dtype), dims)


def model_meta_text(inputs: Iterable[Any], outputs: Iterable[Any],
                    dims: dict[str, DimRange] | None = None) -> str:
    """The metadata text for the C API: a header line, then ``input|output <name> <dtype> <d0,d1,..>``.

    ``inputs``/``outputs`` are ``(name, dtype, shape)`` tuples or objects with those attributes
    (e.g. ``tensors.TensorSpec``), in the order of the model's parameters and results.

    ``dims`` (name -> ``(min, max, step)``) declares dynamic input dimensions: the text is then
    version 2, with a ``dim <name> <min> <max> <step>`` line per dimension before the inputs, and an
    input's shape may name one in place of a number (``input x float32 1,3,48,W``). Output
    dimensions that are not a fixed number are ``"?"`` either way. Without ``dims`` the text is
    version 1, as before.
    """
    ranges = _check_dims(dims)
    lines = ["edgepack-model-meta 2" if ranges else "edgepack-model-meta 1"]
    lines += [f"dim {name} {lo} {hi} {step}" for name, (lo, hi, step) in ranges.items()]
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for t in (_as_meta(t, kind == "output", ranges) for t in tensors):
            shape = ",".join(str(d) for d in t.shape) if t.shape else "-"
            lines.append(f"{kind} {_meta_name(t.name)} {t.dtype} {shape}")
    return "\n".join(lines) + "\n"


def write_model_meta(path: Path, inputs: Iterable[Any], outputs: Iterable[Any],
                     dims: dict[str, DimRange] | None = None) -> Path:
    """Write the metadata file next to a model library: ``model.so`` -> ``model.meta``.

    ``ep_model_open("dir/model.so", NULL, ...)`` reads ``dir/model.meta`` when the library has no
    metadata embedded. ``path`` is the .meta path itself.
    """
    path = Path(path)
    write_text_atomic(path, model_meta_text(inputs, outputs, dims))
    return path


def _parse_meta(text: str) -> tuple[tuple[TensorMeta, ...], tuple[TensorMeta, ...], dict[str, DimRange]]:
    lines = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines or lines[0] not in (["edgepack-model-meta", "1"], ["edgepack-model-meta", "2"]):
        raise EdgepackError("Not an edgepack metadata file (version 1 or 2).")
    found: dict[str, list[TensorMeta]] = {"input": [], "output": []}
    dims: dict[str, DimRange] = {}
    for fields in lines[1:]:
        if fields[0] == "dim":
            _, name, lo, hi, step = fields
            dims[name] = (int(lo), int(hi), int(step))
            continue
        kind, name, dtype, shape = fields
        dims_of = () if shape == "-" else tuple(
            int(d) if d.isdigit() else d for d in shape.split(","))
        decoded = re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), name)
        found[kind].append(TensorMeta(decoded.encode("latin-1").decode("utf-8"), dtype, dims_of))
    return tuple(found["input"]), tuple(found["output"]), dims


def parse_model_meta(text: str) -> tuple[tuple[TensorMeta, ...], tuple[TensorMeta, ...]]:
    """Inverse of ``model_meta_text`` (for tests and tools that read bundles): (inputs, outputs).

    A dynamic input dimension is its name (a str), a run-time output dimension ``"?"``; the
    ranges of the names are in ``parse_model_meta_dims``."""
    inputs, outputs, _ = _parse_meta(text)
    return inputs, outputs


def parse_model_meta_dims(text: str) -> dict[str, DimRange]:
    """The dynamic dimensions of a metadata text: name -> (min, max, step); {} for version 1."""
    return _parse_meta(text)[2]


def _meta_c_source(text: str, prefix: str) -> str:
    """C source defining the library function ``edgepack_meta`` that returns the metadata text.

    The function follows TVM's packed-function C ABI so that the C API finds it through the
    model module (``__tvm_ffi_<prefix>edgepack_meta``); for a system library it registers
    itself, like TVM's own functions, from a constructor.
    """
    symbol = f"__tvm_ffi_{prefix}edgepack_meta"
    literal = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\?' else f"\\{ord(c):03o}"
        for c in text
    )
    return f"""/* generated by edgepack: the model metadata (see edgepack.h) */
#include <stdint.h>
#include <string.h>
#ifdef __cplusplus
extern "C" {{
#endif
typedef struct {{
  int32_t type_index;
  uint32_t zero_padding;
  union {{ int64_t v_int64; const void* v_ptr; }} v;
}} edgepack_any; /* layout of TVMFFIAny */
static const char edgepack_meta_text[] = "{literal}";
__attribute__((visibility("default"))) int {symbol}(void* self, const void* args, int32_t num_args,
                                                   edgepack_any* result) {{
  (void)self; (void)args; (void)num_args;
  memset(result, 0, sizeof(*result));
  result->type_index = 4; /* kTVMFFIOpaquePtr */
  result->v.v_ptr = edgepack_meta_text;
  return 0;
}}
#ifdef EDGEPACK_SYSTEM_LIB
int TVMFFIEnvModRegisterSystemLibSymbol(const char* name, void* ptr);
__attribute__((constructor)) static void edgepack_meta_register(void) {{
  TVMFFIEnvModRegisterSystemLibSymbol("{symbol}", (void*)&{symbol});
}}
#endif
#ifdef __cplusplus
}}
#endif
"""


def _compile_meta_object(meta_text: str, prefix: str, out: Path, cc: str, cflags: Sequence[str],
                         system_lib: bool, log: Progress | None) -> Path:
    src = out.with_suffix(".c")
    src.write_text(_meta_c_source(meta_text, prefix))
    cmd = [cc, "-c", "-O2", "-fPIC", *cflags, *(["-DEDGEPACK_SYSTEM_LIB"] if system_lib else []), src, "-o", out]
    result = run(cmd, log=log)
    if result.returncode != 0:
        raise ToolchainError(f"Compiling the model metadata with {cc} failed.", tail(result.stderr))
    return out


def system_lib_prefix(executable) -> str | None:
    """The system-lib symbol prefix of a compiled executable, or None if it is not a system lib.

    The host-code module (LLVM's) of the executable answers ``__tvm_is_system_module``; kernel modules
    (OpenCL, WGSL) and the VM's own do not have the function."""
    stack = [executable.mod]
    while stack:
        m = stack.pop()
        try:
            is_system = m.get_function("__tvm_is_system_module", query_imports=False)
        except Exception:  # noqa: BLE001  not a host-code module (kernel modules may raise anything)
            is_system = None
        if is_system is not None and is_system():
            return str(m.get_function("__tvm_get_system_lib_prefix")())
        stack.extend(m.imports)
    return None


def export_model_static(
    executable,
    out_path: Path,
    cc: str,
    *,
    meta_text: str | None = None,
    cflags: Sequence[str] = (),
    packed: Packed | None = None,
    log: Progress | None = None,
) -> Path:
    """Write the model as a static archive (``libmodel.a``) for linking into a C program.

    ``executable`` must come from ``relax.build(mod, target, system_lib=True)`` (``tvm.compile``
    has no such switch): its functions then register themselves into TVM's system library at
    program start instead of being looked up with dlsym. Symbols are ``__tvm_ffi_<prefix><func>``
    plus ``<prefix>__tvm_ffi__library_bin`` (the VM bytecode and constants); the prefix is the
    IRModule attribute ``system_lib_prefix`` (default ``""``), so two models in one program need
    different prefixes (``mod.with_attr("system_lib_prefix", "model_one_")``; TVM 0.27 fails on
    prefixes shorter than 8 characters, which it stores as a small string). Link the archive
    inside ``-Wl,--whole-archive`` (nothing references it by name) and open it with
    ``ep_model_open_system_lib(prefix, NULL, &model)``. ``meta_text`` (from ``model_meta_text``)
    is embedded so the program needs no other file.
    """
    prefix = system_lib_prefix(executable)
    if prefix is None:
        raise EdgepackError(
            "The model was not built as a system library, so it cannot be linked statically.",
            "Build it with tvm.relax.build(mod, target, system_lib=True).",
        )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    ar = archiver(cc)
    with tempfile.TemporaryDirectory(prefix="edgepack-static-") as tmp_name:
        tmp = Path(tmp_name)
        executable.export_library(str(tmp / "model.tar"), **packing(cc, list(cflags), packed or {}))
        objects_dir = tmp / "objects"
        objects_dir.mkdir()
        with tarfile.open(tmp / "model.tar") as tar:
            try:
                tar.extractall(objects_dir, filter="data")
            except TypeError:  # Python < 3.11.4 has no extraction filters; TVM wrote this tar
                tar.extractall(objects_dir)
        objects = sorted(p for p in objects_dir.rglob("*") if p.is_file())
        if meta_text is not None:
            objects.append(_compile_meta_object(meta_text, prefix, tmp / "edgepack_meta.o", cc, cflags, True, log))
        staged = tmp / out_path.name
        result = run([ar, "rcs", staged, *objects], log=log)
        if result.returncode != 0:
            raise ToolchainError(f"Creating {out_path.name} with {ar} failed.", tail(result.stderr))
        shutil.move(staged, out_path)
    return out_path


def export_model_shared(
    executable,
    out_path: Path,
    cxx: str,
    *,
    meta_text: str | None = None,
    cc: str | None = None,
    options: Sequence[str] = (),
    packed: Packed | None = None,
    log: Progress | None = None,
) -> Path:
    """Write the model as a shared library for ``ep_model_open``, with the metadata embedded.

    The same as ``executable.export_library(path, fcompile=cross_compiler(cxx))`` plus one small
    object holding ``meta_text``; with the metadata inside, the library is self-contained (it also
    works from memory with ``ep_model_open_memory``).

    The executable must NOT be built with ``system_lib=True``: such a library registers its
    symbols in TVM's process-wide system-library table when loaded and leaves them dangling when
    it is closed, so a later ``ep_model_open_system_lib`` in that process would crash. Build the
    shared and the static library from two builds (``tvm.compile`` and ``relax.build(...,
    system_lib=True)``).
    """
    from tvm.support import cc as tvm_cc

    if system_lib_prefix(executable) is not None:
        raise EdgepackError(
            "This model was built as a system library, which must not be exported as a shared library.",
            "Export the shared library from a build without system_lib=True (tvm.compile(mod, target)).",
        )
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgepack-shared-") as tmp_name:
        addons = []
        if meta_text is not None:
            meta_cc = cc or c_compiler_for(cxx)
            addons.append(str(_compile_meta_object(meta_text, "", Path(tmp_name) / "edgepack_meta.o", meta_cc,
                                                   options, False, log)))
        base = tvm_cc.cross_compiler(cxx, options=list(options))

        def fcompile(output, objects, options=None):
            return base(output, objects, options)

        # no get_target_triple: for a model without kernels (no LLVM module to take the target from),
        # TVM packs the VM bytecode into an object for the compile function's get_target_triple(),
        # which cross_compiler takes from this machine's compiler (x86: "devc.o is incompatible with
        # aarch64"), and a bare triple misses the float ABI (armhf: "uses VFP register arguments");
        # without it TVM writes the bytecode as C, which cxx compiles with the device's ABI
        fcompile.output_format = base.output_format
        try:
            executable.export_library(str(out_path), fcompile=fcompile, addons=addons,
                                      **packing(cc or c_compiler_for(cxx), list(options), packed or {}))
        except Exception as exc:  # TVM raises RuntimeError with the linker output
            raise ToolchainError(f"Linking {out_path.name} with {cxx} failed.", tail(str(exc))) from exc
    return out_path
