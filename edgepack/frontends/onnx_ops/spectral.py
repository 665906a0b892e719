"""Spectral operators: DFT and STFT as constant matrices."""

from __future__ import annotations

import numpy as _np
from tvm import relax
from tvm.relax.frontend.onnx.onnx_frontend import OnnxOpConverter

from edgepack.frontends.onnx_ops.common import _const_value, _dtype, _opt, _require_consts, _shape
from edgepack.frontends.onnx_ops.registry import register


def _dft_matrix(length: int, comps: int, n: int, inverse: bool, onesided: bool):
    """The real matrix [length*comps, m*comps_out] of ONNX DFT along one axis (numpy's FFT on the
    basis signals: the transform is linear in the real and imaginary parts)."""
    basis = _np.eye(length).astype(_np.complex128)
    rows = [basis] if comps == 1 else [basis, 1j * basis]
    blocks = []
    for b in rows:
        if inverse and onesided:
            out = _np.fft.irfft(b, n=n, axis=1)[..., None]
        elif inverse:
            out = _np.fft.ifft(b, n=n, axis=1)
        else:
            out = _np.fft.fft(b, n=n, axis=1)
            if onesided:
                out = out[:, : n // 2 + 1]
        if _np.iscomplexobj(out):
            out = _np.stack([out.real, out.imag], axis=-1)
        blocks.append(out)  # [length, m, comps_out]
    stacked = _np.stack(blocks, axis=1)  # [length, comps, m, comps_out]
    m, comps_out = stacked.shape[2], stacked.shape[3]
    return stacked.reshape(length * comps, m * comps_out), m, comps_out


def _apply_dft(bb, x, axis: int, n: int | None, inverse: bool, onesided: bool):
    shape = _shape(x)
    rank = len(shape)
    axis = axis % rank
    length, comps = shape[axis], shape[-1]
    if n is None:
        n = 2 * (length - 1) if inverse and onesided else length
    matrix, m, comps_out = _dft_matrix(length, comps, n, inverse, onesided)
    dt = _dtype(x)
    # move the signal axis next to the component axis: [..., L, c] -> flatten (L, c) -> matmul
    perm = [i for i in range(rank - 1) if i != axis] + [axis, rank - 1]
    moved = bb.normalize(relax.op.permute_dims(x, perm))
    lead = [shape[i] for i in perm[:-2]]
    flat = relax.op.reshape(moved, lead + [length * comps])
    # float64 accumulation: the reference's near-zero outputs (e.g. imaginary parts) need it
    out = relax.op.matmul(relax.op.astype(flat, "float64"), relax.const(matrix, "float64"))
    out = bb.normalize(relax.op.astype(relax.op.reshape(out, lead + [m, comps_out]), dt))
    inv = [0] * rank
    for i, p in enumerate(perm):
        inv[p] = i
    return relax.op.permute_dims(out, inv)


@register("DFT")
class DFT(OnnxOpConverter):
    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        n = _const_value(_opt(inputs, 1)) if _opt(inputs, 1) is not None else None
        return _apply_dft(bb, inputs[0], int(attr.get("axis", 1)), None if n is None else int(n.reshape(-1)[0]),
                          bool(attr.get("inverse", 0)), bool(attr.get("onesided", 0)))

    @classmethod
    def _impl_v20(cls, bb, inputs, attr, params):
        n_e, axis_e = _opt(inputs, 1), _opt(inputs, 2)
        n = _const_value(n_e) if n_e is not None else None
        axis = _const_value(axis_e) if axis_e is not None else _np.array(-2)
        if (n_e is not None and n is None) or axis is None:
            raise ValueError("DFT needs constant dft_length and axis.")
        return _apply_dft(bb, inputs[0], int(axis.reshape(-1)[0]), None if n is None else int(n.reshape(-1)[0]),
                          bool(attr.get("inverse", 0)), bool(attr.get("onesided", 0)))


@register("STFT")
class STFT(OnnxOpConverter):
    """Frames gathered with constant indices, windowed, then the DFT matrix (onesided by default)."""

    @classmethod
    def _impl_v17(cls, bb, inputs, attr, params):
        x, step_e, window, length_e = inputs[0], inputs[1], _opt(inputs, 2), _opt(inputs, 3)
        step = int(_require_consts("STFT", [step_e])[0].reshape(-1)[0])
        if length_e is not None:
            frame = int(_require_consts("STFT", [length_e])[0].reshape(-1)[0])
        else:
            frame = _shape(window)[0]
        _, signal, _ = _shape(x)
        frames = 1 + (signal - frame) // step
        idx = (_np.arange(frames)[:, None] * step + _np.arange(frame)[None, :]).astype("int64")
        framed = relax.op.take(x, relax.const(idx, "int64"), axis=1)  # [batch, frames, frame, comps]
        if window is not None:
            framed = framed * relax.op.reshape(window, [1, 1, frame, 1])
        return _apply_dft(bb, bb.normalize(framed), 2, frame, False, bool(attr.get("onesided", 1)))
