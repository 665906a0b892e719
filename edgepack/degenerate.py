"""Whether a reference output can show a wrong build at all.

A validation only means something if the reference output depends on what the kernels compute: an output
that is the same everywhere (a network with constant weights), the same for every input, smaller than the
absolute tolerance everywhere (a detector's map on noise: a build that writes zeros passes), saturated
probabilities (a softmax at 1.0 / 4e-8: an error smaller than the tolerance changes nothing visible) or a
near tie at the decision (0.5 / 0.5: the classes swap with any error; told for outputs of probabilities,
since logits cannot be told from coordinates) passes or fails whatever the build
computes. ``validate`` reports such an output as degenerate and says why.
"""

from __future__ import annotations

import numpy as np

#: top-1 and top-2 closer than this many tolerances (or 1% of top-1) is a near tie; an output of several
#: rows (a sequence's characters, a detector's anchors) is degenerate only where every row is
TIE_TOLERANCES = 10.0
TIE_FRACTION = 0.01


def _float(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)


def _probability_rows(expected: np.ndarray) -> np.ndarray | None:
    """The rows of an output that decides between classes (rows of probabilities along its last axis, as a
    softmax gives); None for anything else (logits, boxes, landmarks, maps, states cannot be told apart)."""
    if not _float(expected) or expected.ndim == 0 or expected.shape[-1] < 2 or expected.size == 0:
        return None
    rows = expected.reshape(-1, expected.shape[-1]).astype(np.float64)
    if not np.all(np.isfinite(rows)) or not np.all((rows >= 0) & (rows <= 1)):
        return None
    return rows if np.allclose(rows.sum(axis=-1), 1.0, atol=1e-3) else None


def degeneracy(expected: np.ndarray, atol: float, rtol: float) -> str:
    """Why this reference output cannot tell a right build from a wrong one ("" when it can)."""
    e = np.asarray(expected)
    if e.size > 1:
        flat = e.ravel()
        same = flat == flat[0]
        if _float(e):
            same |= np.isnan(flat) & np.isnan(flat[0])
        if np.all(same):
            return f"constant: every one of its {e.size} values is {flat[0].item()!r}"
    if _float(e) and e.size and np.all(np.abs(e) <= atol):
        return f"vanishing: every value is within the absolute tolerance ({atol:g}) of 0, so zeros would pass"
    rows = _probability_rows(e)
    if rows is None:
        return ""
    tol = atol + rtol * np.abs(rows)
    saturated = np.all((rows <= tol) | (rows >= 1.0 - tol), axis=-1)
    if np.all(saturated):
        return "saturated: every probability is within the tolerance of 0 or 1, so errors below it are invisible"
    top2 = np.sort(rows, axis=-1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    tie = gap <= np.maximum(TIE_TOLERANCES * (atol + rtol * np.abs(top2[:, 1])), TIE_FRACTION * np.abs(top2[:, 1]))
    if np.all(tie | saturated):  # no row whose decision an error would show
        row = int(np.argmax(tie))
        return (f"near tie: its top two probabilities{f' (row {row})' if len(rows) > 1 else ''} are "
                f"{top2[row, 1]:.6g} and {top2[row, 0]:.6g}, so any error can swap the decision")
    return ""


def input_independent(first: np.ndarray, second: np.ndarray) -> str:
    """Why an output that two different inputs gave is degenerate ("" when they differ)."""
    first, second = np.asarray(first), np.asarray(second)
    if first.shape == second.shape and first.size > 0 and np.array_equal(first, second, equal_nan=_float(first)):
        return "input-independent: two different inputs give exactly the same values"
    return ""
