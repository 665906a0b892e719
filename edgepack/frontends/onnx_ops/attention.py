"""Attention operators: ONNX Attention (opset 23/24), RotaryEmbedding and LinearAttention.

FlexAttention, whose modifiers are subgraphs, is converted by the importer (``importer.py``).
"""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend as _tvm
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _attr_str, _const, _dtype, _opt, _rank, _shape
from edgepack.frontends.onnx_ops.registry import register


@register("Attention")
class Attention(OnnxOpConverter):
    """ONNX Attention (opset 23/24): 3-D or 4-D Q/K/V, grouped-query heads, KV cache (past/present),
    bool or additive masks (shorter masks padded), causal masking, softcap, scale, softmax precision,
    nonpad_kv_seqlen and the optional QK output. Follows the ONNX reference implementation step by step.
    TVM's converter of the same name is the com.microsoft contrib op (``num_heads``): kept for that."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        if "num_heads" in attr:
            return _tvm.Attention.get_converter(1)(bb, inputs, attr, params)
        return cls._impl_v23(bb, inputs, attr, params)

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        if "num_heads" in attr:
            return _tvm.Attention.get_converter(1)(bb, inputs, attr, params)
        q, k, v = inputs[0], inputs[1], inputs[2]
        mask, past_k, past_v, nonpad = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5), _opt(inputs, 6)
        dt = _dtype(q)
        three_d = _rank(q) == 3
        if three_d:
            qh, kvh = int(attr["q_num_heads"]), int(attr["kv_num_heads"])

            def heads(t, n):
                b, s, hidden = _shape(t)
                return bb.normalize(relax.op.permute_dims(relax.op.reshape(t, [b, s, n, hidden // n]), [0, 2, 1, 3]))

            q, k, v = heads(q, qh), heads(k, kvh), heads(v, kvh)
        batch, q_heads, q_len, head = _shape(q)
        scale = attr.get("scale")
        scale = float(1 / _np.sqrt(head)) if scale is None else float(scale)
        root = _const(_np.sqrt(scale), dt)
        present_k = bb.normalize(relax.op.concat([past_k, k], axis=2)) if past_k is not None else k
        present_v = bb.normalize(relax.op.concat([past_v, v], axis=2)) if past_v is not None else v
        kv_len = _shape(present_k)[2]
        neg_inf = _const(-_np.inf, dt)
        bias = None
        if mask is not None:
            mask_len = _shape(mask)[-1]
            is_bool = _dtype(mask) == "bool"
            if mask_len < kv_len:
                pads = [0, 0] * (_rank(mask) - 1) + [0, kv_len - mask_len]
                if is_bool:
                    mask = relax.op.astype(relax.op.nn.pad(relax.op.astype(mask, "int8"), pads, pad_value=0.0), "bool")
                else:
                    mask = relax.op.nn.pad(mask, pads, pad_value=float("-inf"))
            bias = relax.op.where(mask, _const(0, dt), neg_inf) if is_bool else mask
        if attr.get("is_causal", 0):
            past = _shape(past_k)[2] if past_k is not None else 0
            causal = _np.zeros((q_len, kv_len), dtype=dt)
            tri = _np.triu(_np.ones((q_len, kv_len - past)), k=1) == 1
            causal[:, past:][tri] = -_np.inf
            causal_c = relax.const(causal, dt)
            bias = causal_c if bias is None else bias + causal_c
        if nonpad is not None:
            positions = relax.const(_np.arange(kv_len, dtype=_dtype(nonpad)).reshape(1, 1, 1, kv_len), _dtype(nonpad))
            keep = relax.op.less(positions, relax.op.reshape(nonpad, [batch, 1, 1, 1]))
            pad_bias = relax.op.where(keep, _const(0, dt), neg_inf)
            bias = pad_bias if bias is None else bias + pad_bias
        kv_heads = _shape(present_k)[1]
        kk, vv = present_k, present_v
        if kv_heads != q_heads and q_heads % kv_heads == 0:  # grouped-query: h0, h0, h1, h1, ...
            kk = relax.op.repeat(kk, q_heads // kv_heads, axis=1)
            vv = relax.op.repeat(vv, q_heads // kv_heads, axis=1)
        qk = bb.normalize(relax.op.matmul(q * root, relax.op.permute_dims(kk * root, [0, 1, 3, 2])))
        softcap = float(attr.get("softcap", 0.0))
        if softcap > 0:
            cap = _const(softcap, dt)
            qk = bb.normalize(relax.op.tanh(qk / cap) * cap)
        with_bias = bb.normalize(qk + bias) if bias is not None else qk
        mode = int(attr.get("qk_matmul_output_mode", 0))
        precision = attr.get("softmax_precision")
        sdt = dt
        if precision is not None:
            from onnx import helper

            sdt = str(helper.tensor_dtype_to_np_dtype(int(precision)))
        scores = relax.op.astype(with_bias, sdt) if sdt != dt else with_bias
        probs = bb.normalize(relax.op.nn.softmax(scores, axis=-1))
        vv_s = relax.op.astype(vv, sdt) if sdt != dt else vv
        out = relax.op.matmul(probs, vv_s)
        if sdt != dt:
            out = relax.op.astype(out, dt)
        if three_d:
            out = relax.op.reshape(bb.normalize(relax.op.permute_dims(out, [0, 2, 1, 3])), [batch, q_len, -1])
        qk_out = {2: with_bias, 3: probs}.get(mode, qk)
        if _dtype(bb.normalize(qk_out)) != dt:
            qk_out = relax.op.astype(qk_out, dt)
        results = [out, present_k, present_v, qk_out]
        n = attr["tvm_custom"]["num_outputs"]
        return out if n == 1 else relax.Tuple(results[:n])


@register("RotaryEmbedding")
class RotaryEmbedding(OnnxOpConverter):
    """RotaryEmbedding (opset 23), as the ONNX reference computes it (3-D or 4-D input,
    position_ids or per-position caches, interleaved or split halves, partial rotary_embedding_dim)."""

    @classmethod
    def _impl_v23(cls, bb, inputs, attr, params):
        x, cos, sin, pos = inputs[0], inputs[1], inputs[2], _opt(inputs, 3)
        original = _shape(x)
        four_d = len(original) == 4
        if four_d:  # [b, heads, s, d] -> [b, s, heads, d]
            x = bb.normalize(relax.op.permute_dims(x, [0, 2, 1, 3]))
        else:
            b, s, hidden = original
            heads = int(attr["num_heads"])
            x = bb.normalize(relax.op.reshape(x, [b, s, heads, hidden // heads]))
        b, s, heads, head = _shape(x)
        rot = int(attr.get("rotary_embedding_dim", 0)) or head
        half = rot // 2
        if pos is not None:
            cos, sin = relax.op.take(cos, pos, axis=0), relax.op.take(sin, pos, axis=0)
        cos = bb.normalize(relax.op.expand_dims(cos, 2))
        sin = bb.normalize(relax.op.expand_dims(sin, 2))
        x_rot = relax.op.strided_slice(x, [3], [0], [rot])
        if attr.get("interleaved", 0):
            x1 = relax.op.strided_slice(x_rot, [3], [0], [rot], [2])
            x2 = relax.op.strided_slice(x_rot, [3], [1], [rot], [2])
        else:
            x1 = relax.op.strided_slice(x_rot, [3], [0], [half])
            x2 = relax.op.strided_slice(x_rot, [3], [half], [rot])
        real = cos * x1 - sin * x2
        imag = sin * x1 + cos * x2
        if attr.get("interleaved", 0):
            rotated = relax.op.reshape(relax.op.stack([real, imag], axis=4), [b, s, heads, rot])
        else:
            rotated = relax.op.concat([real, imag], axis=3)
        out = rotated if rot == head else relax.op.concat([rotated, relax.op.strided_slice(x, [3], [rot], [head])], axis=3)
        out = bb.normalize(out)
        return relax.op.permute_dims(out, [0, 2, 1, 3]) if four_d else relax.op.reshape(out, original)


@register("LinearAttention")
class LinearAttention(OnnxOpConverter):
    """LinearAttention (opset 26): the reference's recurrence (linear / gated / delta / gated_delta
    update rules, grouped-query heads) unrolled over the static sequence length, in float32."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        q, k, v = inputs[0], inputs[1], inputs[2]
        past, decay, beta = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
        rule = _attr_str(attr, "update_rule", "gated_delta")
        gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
        qh, kvh = int(attr["q_num_heads"]), int(attr["kv_num_heads"])
        out_dt = _dtype(q)
        b, t, _ = _shape(q)
        dk, dv = _shape(q)[2] // qh, _shape(v)[2] // kvh
        group = qh // kvh

        def heads(x, n):  # (B, T, H*D) -> (B, H, T, D) float32
            x = bb.normalize(relax.op.astype(x, "float32")) if _dtype(x) != "float32" else x
            return bb.normalize(relax.op.permute_dims(relax.op.reshape(x, [b, t, n, -1]), [0, 2, 1, 3]))

        q4, k4, v4 = heads(q, qh), heads(k, kvh), heads(v, kvh)
        if gating:
            decay4 = heads(decay, kvh)  # (B, Hkv, T, 1) per head or (B, Hkv, T, dk) per key dimension
        if delta:
            beta4 = heads(beta, _shape(beta)[2])  # (B, Hkv or 1, T, 1)
        if past is not None:
            state = bb.normalize(relax.op.astype(past, "float32") if _dtype(past) != "float32" else past)
            state_dt = _dtype(past)
        else:
            state = bb.normalize(relax.op.zeros((b, kvh, dk, dv), "float32"))
            state_dt = out_dt
        scale = attr.get("scale")
        scale = float(1 / _np.sqrt(dk)) if not scale else float(scale)

        def at(x, i):
            return relax.op.squeeze(relax.op.strided_slice(x, [2], [i], [i + 1]), [2])

        outs = []
        for i in range(t):
            k_t, v_t = at(k4, i), at(v4, i)
            if gating:
                state = state * relax.op.expand_dims(relax.op.exp(at(decay4, i)), -1)
            if delta:
                retrieved = relax.op.squeeze(relax.op.matmul(relax.op.expand_dims(k_t, 2), state), [2])
                v_t = at(beta4, i) * (v_t - retrieved)
            state = bb.normalize(state + relax.op.expand_dims(k_t, -1) * relax.op.expand_dims(v_t, 2))
            read = state if group == 1 else relax.op.repeat(state, group, axis=1)
            o = relax.op.matmul(relax.op.expand_dims(at(q4, i), 2), read)  # (B, Hq, 1, dv)
            outs.append(bb.normalize(o * _const(scale, "float32")))
        y = bb.normalize(relax.op.concat(outs, axis=2))  # (B, Hq, T, dv)
        y = relax.op.reshape(bb.normalize(relax.op.permute_dims(y, [0, 2, 1, 3])), [b, t, qh * dv])
        if out_dt != "float32":
            y = relax.op.astype(y, out_dt)
        present = relax.op.astype(state, state_dt) if state_dt != "float32" else state
        if attr["tvm_custom"]["num_outputs"] > 1:
            return relax.Tuple([y, present])
        return y
