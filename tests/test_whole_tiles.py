"""Whole tiles of a kernel over a run-time size (``backends/cpu/whole_tiles.py``): the loop over tiles is split
into a body without bounds checks, for tiles that fit, and the guarded one, for the last; a kernel of static
extents is left as it was. A tile kernel (4 elements per tile, unrolled, as a schedule's split of a ``--dim``
size leaves it) is built through the CPU builds' TIR pipeline and run at sizes whose last tile is partial; the
output sits in a larger buffer whose tail must stay untouched. The models' own checks: the OCR recognizer's
five widths in ``test_dynamic_shapes.py`` (host and qemu)."""

from __future__ import annotations

import numpy as np
import pytest

import edgepack.backends.cpu.whole_tiles as whole_tiles_module

SIZES = (1, 3, 4, 5, 17)
SENTINEL = -7.0


def _tile_kernel(static: int | None = None):
    """``y = 2x + 1`` in tiles of 4 (the last partial), over a run-time size ``n`` or the ``static`` one."""
    from tvm import tirx
    from tvm.script import tirx as T

    n = tirx.Var("n", "int64") if static is None else static

    @T.prim_func(s_tir=True)
    def tiled(a: T.handle, b: T.handle):
        x = T.match_buffer(a, (n,), "float32")
        y = T.match_buffer(b, (n,), "float32")
        for i in T.parallel((n + 3) // 4):
            for k in T.unroll(4):
                with T.sblock("y"):
                    v = T.axis.spatial(n, i * 4 + k)
                    T.where(i * 4 + k < n)
                    y[v] = x[v] * T.float32(2) + T.float32(1)

    return tiled.with_attr("global_symbol", "main")


def _build(func):
    import tvm

    from edgepack.backends.cpu.stack import tir_pipeline

    return tvm.compile(tvm.IRModule({"main": func}), target="llvm", tir_pipeline=tir_pipeline())


def _run(lib, n: int) -> np.ndarray:
    """``lib`` on ``n`` values; the output written into the first ``n`` of ``n + 8`` (the rest: ``SENTINEL``)."""
    import tvm

    x = np.arange(1, n + 1, dtype="float32")
    out = tvm.runtime.tensor(np.full(n + 8, SENTINEL, "float32"))
    lib["main"](tvm.runtime.tensor(x), out._create_view((n,)))
    return out.numpy()


def _splits(monkeypatch) -> list[bool]:
    """Spy on the pass: per kernel it sees, whether it split a loop."""
    seen: list[bool] = []
    original = whole_tiles_module._split_loops

    def spy(stmt, analyzer):
        out = original(stmt, analyzer)
        seen.append(not out.same_as(stmt))
        return out

    monkeypatch.setattr(whole_tiles_module, "_split_loops", spy)
    return seen


def test_a_loop_over_a_run_time_size_runs_whole_tiles_unchecked_and_the_last_checked(monkeypatch):
    seen = _splits(monkeypatch)
    lib = _build(_tile_kernel())
    assert True in seen  # the loop over tiles was split
    for n in SIZES:
        out = _run(lib, n)
        np.testing.assert_array_equal(out[:n], np.arange(1, n + 1) * 2.0 + 1.0, err_msg=f"n = {n}")
        assert (out[n:] == SENTINEL).all(), f"n = {n}: written past the end: {out[n:]}"


def test_a_kernel_of_static_extents_is_left_as_it_was(monkeypatch):
    seen = _splits(monkeypatch)
    lib = _build(_tile_kernel(static=17))
    assert seen and True not in seen
    out = _run(lib, 17)
    np.testing.assert_array_equal(out[:17], np.arange(1, 18) * 2.0 + 1.0)


@pytest.mark.parametrize("weaker", ["first row", "no guard"])
def test_a_whole_tile_condition_weaker_than_the_last_row_fails(monkeypatch, weaker):
    """Checked by breaking it: with the fast body taken for a tile whose first row is in range (or always),
    a partial last tile writes past the output's end."""
    from tvm import tirx

    def weak(guards, analyzer):  # the guards come in the order of the tile's rows
        return analyzer.simplify(guards[0]) if weaker == "first row" else tirx.const(True)

    monkeypatch.setattr(whole_tiles_module, "_strongest", weak)
    lib = _build(_tile_kernel())
    broken = [n for n in SIZES if (_run(lib, n)[n:] != SENTINEL).any()]
    assert broken == [n for n in SIZES if n % 4], broken
