"""Integer sums scaled to float are rounded before they are added: a pass of the CPU builds' TIR pipeline
(``cpu/stack.py``) and of the GPU builds' (``float_literals.py``).

TVM's LLVM backend allows LLVM to contract any multiply and add into one fused multiply-add (one
rounding instead of two). For float models that is a last-bit difference; for a dynamically quantized
model it is not: ONNX Runtime computes ``float(int32 sum) * scale`` and then adds the bias (ConvInteger,
Cast, Mul, Add), the next DynamicQuantizeLinear rounds the result to 8 bits, and a last-bit difference at
a rounding tie becomes one step there, then many after the next convolutions (PP-OCRv2's CRNN quantized
by ``quantize_dynamic``: 2 values one step off after 16 convolutions, 0.06 at its LSTM's input).
So every product of an integer converted to float is passed through ``llvm.arithmetic.fence``, which
keeps it a product of its own; LLVM still vectorizes it and still contracts every other multiply.

OpenCL C contracts within an expression too (``FP_CONTRACT`` is on by default: PoCL fused them, and the
CRNN's output was 0.0077 off, one 8-bit value a step off after 20 convolutions), never across statements:
in GPU kernels each such product is bound to a variable of its own (a ``Let``, which the code generators
print as a declaration).
"""

from __future__ import annotations


def _integer_as_float(expr) -> bool:
    from tvm import tirx

    return isinstance(expr, tirx.Cast) and expr.ty.dtype.type_code == 2 and expr.value.ty.dtype.type_code in (0, 1) \
        and expr.value.ty.dtype.bits >= 32  # int32 sums (8-bit values converted to float are exact in any order)


def _fenced(mul):
    from tvm import tirx

    if not (_integer_as_float(mul.a) or _integer_as_float(mul.b)):
        return mul
    return tirx.call_llvm_pure_intrin(str(mul.ty.dtype), "llvm.arithmetic.fence", mul)


def _bound(mul):
    from tvm import tirx

    if not (_integer_as_float(mul.a) or _integer_as_float(mul.b)):
        return mul
    product = tirx.Var("scaled", str(mul.ty.dtype))
    return tirx.Let(product, mul, product)


def separate_products(form: str = "fence"):
    """The TIR pass: every ``float(integer) * x`` kept from contraction: ``form`` "fence" (LLVM's
    arithmetic fence: CPU builds) or "statement" (a variable of its own: OpenCL and WGSL sources)."""
    import tvm_ffi
    from tvm import tirx

    rewrite = {"fence": _fenced, "statement": _bound}[form]

    @tirx.transform.prim_func_pass(opt_level=0, name=f"edgepack.SeparateProducts.{form}")
    def separate_products_pass(func, _mod, _ctx):
        return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.Mul, rewrite)]))

    return separate_products_pass
