"""8-bit model inputs and outputs of a Vulkan build, read and written as 32-bit words of the caller's buffer.

Inside the model every 8-bit tensor is held in int32 (``wgsl_bytes.py``: WGSL has no 8-bit type), but the
caller's buffers stay 8-bit: the model's signature is the one LiteRT and ONNX Runtime take, and the C
runner, C bundles and the Python API pass int8/uint8 arrays. So the same buffer is seen as int32 words:

- an 8-bit input of N bytes is viewed as N/4 int32 words (``memory.view``, which the VM runs as the
  runtime's ``TVMTensorCreateView``: same memory, no copy) and one kernel unpacks each value from its
  word (little-endian, as WebGPU buffers are: byte k of a word is its bits 8k..8k+7; int8 moved to the top
  and shifted back down, which extends its sign);
- an 8-bit output of N bytes is made as ceil(N/4) words by one kernel packing four values per word (the
  low 8 bits of each: what a cast to 8 bits keeps) and viewed as the 8-bit tensor (a view may be smaller
  than its buffer: a classifier's 10 int8 scores are 3 words).

The runtime makes no view larger than its buffer, so an 8-bit input that is not a whole number of words (its
byte count a multiple of 4, known at compile time) crosses through the device's CPU instead: copied there as
its bytes, widened to int32 there, and copied back (``boundary_devices``: the program's CPU virtual device,
``placement.py``); so does an 8-bit output of a size unknown at compile time, narrowed on the CPU and given
from there. With ``--gpu-only`` both are refused by name (``refuse_unaligned_8_bit_boundary``). An input
that compiled-in pre-processing already reads as words (``processing/frames.py``) is left as it is.

bool inputs and outputs (one byte per element for the caller, held as int32 0/1 inside: ``wgsl_bools.py``)
cross the same way: unpacked as uint8 (any nonzero byte is 1), packed from their 0/1, refused alike.
"""

from __future__ import annotations

import math

from edgepack.backends.folding import UNFOLDED
from edgepack.backends.placement import vdevices
from edgepack.backends.relax_exprs import dtype_of, op_name, static_shape
from edgepack.errors import CompileError

EIGHT_BITS = ("int8", "uint8")
BYTES = (*EIGHT_BITS, "bool")  # every 1-byte type: TVM stores a bool tensor as one byte per element
INJECTIVE = 2  # TVM's OpPatternKind kInjective: the word reads are gathers its analysis does not recognise


def _read_other_than_as_words(func) -> list:
    """The variables of ``func`` some call reads other than through ``memory.view`` (compiled-in
    pre-processing reads a uint8 frame as 32-bit words that way, ``processing/frames.py``)."""
    from tvm import relax

    found = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and op_name(expr) != "relax.memory.view":
            found.extend(a for a in expr.args if isinstance(a, relax.Var))
        elif isinstance(expr, relax.Tuple):
            found.extend(f for f in expr.fields if isinstance(f, relax.Var))

    relax.analysis.post_order_visit(func.body, visit)
    return found


def _outputs(expr) -> list:
    """The tensors a function gives: ``expr`` (its result) or the fields of its tuple."""
    from tvm import relax

    if isinstance(expr, relax.Tuple):
        return [o for f in expr.fields for o in _outputs(f)]
    return [expr]


def is_public(func) -> bool:
    """Whether a Relax function is one the caller calls (its 8-bit tensors are the caller's buffers)."""
    return func.attrs is not None and "global_symbol" in func.attrs


def byte_inputs(func, types: tuple[str, ...] = EIGHT_BITS) -> list:
    """The inputs of a Relax function of ``types`` (8-bit) that it reads as values (not only as words)."""
    attrs = func.attrs
    inputs = func.params[:int(attrs["num_input"])] if attrs and "num_input" in attrs else func.params
    read = _read_other_than_as_words(func)
    return [p for p in inputs if dtype_of(p) in types and any(p.same_as(v) for v in read)]


def _whole_words(expr) -> bool:
    shape = static_shape(expr)
    return shape is not None and math.prod(shape) % 4 == 0


def unaligned_boundary(mod) -> list[tuple[str, str]]:
    """(dtype, description) of the 8-bit and boolean inputs of ``mod``'s public functions that are not a whole
    number of 32-bit words (or of a size unknown at compile time), and of such outputs of a size unknown at
    compile time."""
    from tvm import relax

    odd = []
    for _gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not is_public(func):
            continue
        odd += [(dtype_of(o), f"an output ({dtype_of(o)}, of a size unknown at compile time)")
                for o in _outputs(func.body.body) if dtype_of(o) in BYTES and static_shape(o) is None]
        for p in byte_inputs(func, BYTES):
            shape = static_shape(p)
            if shape is None:
                odd.append((dtype_of(p), f"input {p.name} ({dtype_of(p)}, of a size unknown at compile time)"))
            elif math.prod(shape) % 4:
                odd.append((dtype_of(p), f"input {p.name} ({dtype_of(p)}{list(shape)}, {math.prod(shape)} bytes)"))
    return odd


def refuse_unaligned_8_bit_boundary(mod, model: str = "the model") -> None:
    """With ``--gpu-only``: a CompileError where a Relax function of ``mod`` takes an 8-bit or boolean tensor
    that is not a whole number of 32-bit words, or takes or gives one of a size unknown at compile time (without
    it, those cross through the device's CPU)."""
    odd = unaligned_boundary(mod)
    if odd:
        raise CompileError(
            f"{model} takes or gives 8-bit or boolean tensors that are not a whole number of 32-bit words "
            f"({', '.join(text for _dtype, text in odd)}). WGSL has no 8-bit integers (nor booleans in buffers), so a Vulkan build reads "
            "such an input (one byte per element) as 32-bit words of the caller's buffer, which must then hold a "
            "multiple of 4 bytes, and writes such an output as words, which needs its size at compile time.",
            "Compile it without --gpu-only (such a tensor is then widened on the device's CPU), for an OpenCL "
            "profile (mali-g610) or a CPU profile (rpi4), or give the tensor a static shape of a multiple of 4 "
            "bytes (--input-shape).")


def boundary_devices(mod, types: tuple[str, ...]):
    """The (GPU, CPU) virtual devices ``mod`` needs for its ``types`` inputs and outputs that cannot cross as
    words (added to ``mod`` for the target in scope), or None where every one can."""
    from tvm.target import Target

    odd = [dtype for dtype, _text in unaligned_boundary(mod) if dtype in types]
    return vdevices(mod, Target.current()) if odd else None


def _flat(index, shape):
    """The row-major offset of ``index`` (int32 expressions) in ``shape``."""
    from tvm import tirx

    index = [tirx.Cast("int32", i) for i in index]
    offset = index[0]
    for i, d in zip(index[1:], shape[1:]):
        offset = offset * d + i
    return offset


def _unpack(shape: tuple[int, ...], dtype: str):
    """The TE function making the int32 values of an 8-bit tensor of ``shape`` from its int32 words."""
    from tvm import te, tirx

    def compute(words):
        def value(*index):
            i = _flat(index, shape)
            word, byte = words[tirx.shift_right(i, 2)], tirx.bitwise_and(i, 3)
            if dtype == "int8":  # the byte to the top, then back down: the shift copies its sign bit
                return tirx.shift_right(tirx.shift_left(word, (3 - byte) * 8), 24)
            value = tirx.bitwise_and(tirx.shift_right(word, byte * 8), 255)
            return tirx.min(value, 1) if dtype == "bool" else value  # a bool: 0 or 1, whatever byte is true
        return te.compute(shape, value, name="unpack_bytes")

    return compute


def unpack_constant(bb, value):
    """The int32 values of the 8-bit constant ``value`` (a NumPy array), stored as its int32 words (a quarter
    of the bytes its int32 values take) and unpacked by a kernel emitted through ``bb``. The kernel runs
    at run time: constant folding leaves it (``folding.UNFOLDED``)."""
    import numpy as np
    from tvm import relax

    flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
    words = np.zeros(-(-flat.size // 4) * 4, np.uint8)
    words[:flat.size] = flat
    packed = relax.const(words.view("<i4").astype(np.int32), "int32")
    return bb.emit(bb.call_te(_unpack(tuple(value.shape), str(value.dtype)), packed, primfunc_name_hint="unpack_bytes",
                              primfunc_attrs={"op_pattern": INJECTIVE, UNFOLDED: True}), name_hint="weights_i32")


def _pack(size: int):
    """The TE function making the int32 words of ``size`` 8-bit values from their int32 values (flat): the
    low byte of each; the last word's bytes beyond ``size`` (if any) repeat the last value, unseen by the
    caller, whose view ends before them."""
    from tvm import te, tirx

    def compute(values):
        def byte(w, k):
            i = w * 4 + k
            return tirx.bitwise_and(values[tirx.min(i, size - 1) if size % 4 else i], 255)

        def word(w):
            out = byte(w, 0)
            for k in range(1, 4):
                out = tirx.bitwise_or(out, tirx.shift_left(byte(w, k), 8 * k))
            return out
        return te.compute(((size + 3) // 4,), word, name="pack_bytes")

    return compute


def unpack_inputs(bb, func, inputs: list, devices=None):
    """A dataflow block (emitted through ``bb``, in a scope of ``func``'s parameters) reading each of
    ``inputs`` (8-bit or bool) as words and unpacking them; returns (the block, {parameter: its int32 values},
    a bool's 0 or 1). An input that is not a whole number of words is copied to the CPU of ``devices`` (GPU,
    CPU) as its bytes, widened there and copied back."""
    from tvm import relax

    R = relax.op
    values = {}
    bb.begin_scope(list(func.params))
    bb._begin_dataflow_block()
    for p in inputs:
        if not _whole_words(p) and devices is not None:
            on_cpu = bb.emit(R.to_vdevice(p, devices[1]), name_hint=f"{p.name}_cpu")
            wide = bb.emit(R.astype(on_cpu, "int32"), name_hint=f"{p.name}_i32_cpu")
            values[p] = bb.emit_output(R.to_vdevice(wide, devices[0]), name_hint=f"{p.name}_i32")
            continue
        shape = static_shape(p)
        words = bb.emit(R.memory.view(p, relax.ShapeExpr([math.prod(shape) // 4]), "int32"), name_hint=f"{p.name}_words")
        unpacked = bb.call_te(_unpack(shape, dtype_of(p)), words, primfunc_name_hint="unpack_bytes",
                              primfunc_attrs={"op_pattern": INJECTIVE})
        values[p] = bb.emit_output(unpacked, name_hint=f"{p.name}_i32")
    block = bb._end_block()
    bb.end_scope()
    return block, values


def _has_bytes(types, byte_types: tuple[str, ...]) -> bool:
    from tvm import relax

    if isinstance(types, relax.TupleType):
        return any(_has_bytes(t, byte_types) for t in types.fields)
    return str(getattr(types, "dtype", "")) in byte_types


def _packed(bb, result, types, byte_types: tuple[str, ...], devices=None):
    """``result`` with each tensor that ``types`` says is of ``byte_types`` (and is int32 in ``result``)
    packed into words and viewed as that 8-bit (or bool) tensor, emitted into ``bb``'s dataflow block; one of
    a size unknown at compile time narrowed on the CPU of ``devices`` (GPU, CPU) instead, and given there."""
    from tvm import relax

    R = relax.op
    if not _has_bytes(types, byte_types):
        return result
    if isinstance(types, relax.TupleType):
        fields = result.fields if isinstance(result, relax.Tuple) else [
            bb.emit_output(relax.TupleGetItem(result, i)) for i in range(len(types.fields))]
        return relax.Tuple([_packed(bb, f, t, byte_types, devices) for f, t in zip(fields, types.fields)])
    dtype = str(types.dtype)
    if dtype_of(result) == dtype:  # e.g. an input given back as it is
        return result
    shape = static_shape(result)
    if shape is None and devices is not None:
        on_cpu = bb.emit(R.to_vdevice(result, devices[1]), name_hint="out_cpu")
        return bb.emit_output(R.astype(on_cpu, dtype), name_hint=f"out_{dtype}")
    flat = bb.emit(R.reshape(result, (math.prod(shape),)))
    packed = bb.emit(bb.call_te(_pack(math.prod(shape)), flat, primfunc_name_hint="pack_bytes",
                                primfunc_attrs={"op_pattern": INJECTIVE}), name_hint="out_words")
    return bb.emit_output(R.memory.view(packed, relax.ShapeExpr(list(shape)), dtype), name_hint=f"out_{dtype}")


def pack_outputs(bb, func, result, types, byte_types: tuple[str, ...] = EIGHT_BITS, devices=None):
    """A dataflow block (emitted through ``bb``, in a scope of ``func``'s parameters) packing the outputs
    of ``byte_types`` (8-bit) of ``result`` (the widened result of ``func``, whose original result type is
    ``types``); returns (the block, the new result)."""
    bb.begin_scope(list(func.params))
    bb._begin_dataflow_block()
    result = _packed(bb, result, types, byte_types, devices)
    block = bb._end_block()
    bb.end_scope()
    return block, result


def with_words_at_the_boundary(widen, func, types: tuple[str, ...], devices=None):
    """The public Relax function ``func`` visited by ``widen`` (a mutator that holds ``types`` tensors in
    int32 and reads an input from its ``unpacked`` map), with its ``types`` inputs unpacked from words first
    and its ``types`` outputs packed into words last (through the CPU of ``devices`` where they cannot cross
    as words: ``boundary_devices``)."""
    from tvm import relax

    bb = widen.builder_
    prologue, widen.unpacked = unpack_inputs(bb, func, byte_inputs(func, types), devices)
    body = widen.visit_expr(func).body
    widen.unpacked = {}
    epilogue, result = pack_outputs(bb, func, body.body, func.body.body.ty, types, devices)
    blocks = [b for b in (prologue, *body.blocks, epilogue) if len(b.bindings)]
    bb.begin_scope(list(func.params))
    seq = bb.normalize(relax.SeqExpr(blocks, result))
    bb.end_scope()
    return relax.Function(list(func.params), seq, None, func.is_pure, func.attrs)
