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
print as a declaration), before TVM's WGSL lowering would write ``a * b + c`` as ``fma``. WGSL promises
neither: naga marks nothing exact in SPIR-V, and lavapipe's optimiser reassociated the bias and a
hardswish's ``+ 3`` (``(p + b) + 3`` as ``(p + 3) + b``: the CRNN 0.0078 off at width 120). So in WGSL each
sum such a product is added into is also passed through ``max(sum, -1e30)`` (form "opaque"), which no
optimiser may look through; it changes no finite sum of these sizes.
"""

from __future__ import annotations


def _integer_as_float(expr) -> bool:
    from tvm import tirx

    return isinstance(expr, tirx.Cast) and expr.ty.dtype.type_code == 2 and expr.value.ty.dtype.type_code in (0, 1) \
        and expr.value.ty.dtype.bits >= 32  # int32 sums (8-bit values converted to float are exact in any order)


def _scaled_sum(expr) -> bool:
    """Whether ``expr`` is a product of an integer converted to float."""
    from tvm import tirx

    return isinstance(expr, tirx.Mul) and (_integer_as_float(expr.a) or _integer_as_float(expr.b))


def _fenced(mul):
    from tvm import tirx

    if not _scaled_sum(mul):
        return mul
    return tirx.call_llvm_pure_intrin(str(mul.ty.dtype), "llvm.arithmetic.fence", mul)


def _bound(mul):
    from tvm import tirx

    if not _scaled_sum(mul):
        return mul
    product = tirx.Var("scaled", str(mul.ty.dtype))
    return tirx.Let(product, mul, product)


OPAQUE_FLOOR = -1e30  # below any sum of an 8-bit model's scaled products and biases


def _bound_product(expr) -> bool:
    """Whether ``expr`` is a scaled sum that ``_bound`` gave a variable of its own."""
    from tvm import tirx

    return isinstance(expr, tirx.Let) and _scaled_sum(expr.value) and expr.body.same_as(expr.var)


def _opaque_sum(add):
    from tvm import tirx

    if not (_bound_product(add.a) or _bound_product(add.b)) or add.ty.dtype.bits != 32:
        return add
    return tirx.max(add, tirx.const(OPAQUE_FLOOR, str(add.ty.dtype)))


def separate_products(form: str = "fence"):
    """The TIR pass: every ``float(integer) * x`` kept from contraction: ``form`` "fence" (LLVM's
    arithmetic fence: CPU builds), "statement" (a variable of its own: OpenCL C) or "opaque" (that, and
    each sum it is added into opaque to reassociation: WGSL)."""
    import tvm_ffi
    from tvm import tirx

    rewrites = [(tirx.Mul, _fenced if form == "fence" else _bound)]
    if form == "opaque":
        rewrites.append((tirx.Add, _opaque_sum))

    @tirx.transform.prim_func_pass(opt_level=0, name=f"edgepack.SeparateProducts.{form}")
    def separate_products_pass(func, _mod, _ctx):
        return func.with_body(tvm_ffi.structural_map(func.body, rewrites))

    return separate_products_pass
