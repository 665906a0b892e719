"""Tuning at one size, records applied across a dynamic build's range (``tune --tune-size``,
``backends/sized_records.py``).

A short real tuning run of PP-OCR's classifier at W = 192 (``--input-shape x:1,3,48,W --tune-size W=192``); its
records replayed on the kernels of a build over W = 32..256:32, which then match ONNX Runtime at widths on and
off the tuned one (a replay that cannot be made on the symbolic kernel, e.g. a tile factor fixed at the tuned
size, keeps the default schedule: schedule primitives keep the computation, so the risk is a schedule that
does not apply, not wrong numbers). The CLI's errors: a named dim without a size, records tuned outside the
build's range.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli

from edgepack.backends import TuningRecords, get_backend
from edgepack.dims import parse_dims
from edgepack.frontends import import_model
from edgepack.profiles import get_profile
from edgepack.tuning.records import load_tuning

pytestmark = pytest.mark.slow  # a real tuning run, then dynamic builds

PROFILE = "host"
DIMS = ["W=32..256:32"]


@pytest.fixture(scope="module")
def tuned(models, tmp_path_factory) -> Path:
    """A tuning directory of the classifier at W = 192 (a few trials of four tasks: enough records to replay)."""
    out = tmp_path_factory.mktemp("sized") / "tuning"
    result = run_cli("tune", str(models["ppocr_cls"].path), "-p", PROFILE, "--input-shape", "x:1,3,48,W",
                     "--tune-size", "W=192", "--trials", "16", "--batch", "8", "-o", str(out), "--json", check=True)
    data = json.loads(result.stdout)
    assert data["trials_run"] >= 8, data
    return out


def _all_records(directory: Path):
    """Every record of ``directory`` (a build applies only those that beat their defaults; the replay is tested
    on all of them)."""
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    return JSONDatabase(path_workload=str(directory / "database_workload.json"),
                        path_tuning_record=str(directory / "database_tuning_record.json"),
                        module_equality="structural")


def _build_and_compare(model: Path, directory: Path, widths=(32, 96, 192, 256)) -> tuple[dict, list[float]]:
    import onnxruntime as ort
    import tvm
    from tvm import relax

    profile = get_profile(PROFILE)
    imported = import_model(model, {"x": (1, 3, 48, "W")}, parse_dims(DIMS))
    records = TuningRecords(_all_records(directory), form=load_tuning(directory).meta.form,
                            sizes={"W": 192, "W_32": 6})
    built = get_backend(profile.backend).build(imported, profile.tvm_target(), records=records)
    library = directory.parent / f"dynamic-{id(records)}.so"
    built.executable.export_library(str(library))
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    errors = []
    for w in widths:
        x = np.random.default_rng(w).standard_normal((1, 3, 48, w)).astype(np.float32)
        errors.append(float(np.abs(vm["main"](tvm.runtime.tensor(x)).numpy() - session.run(None, {"x": x})[0]).max()))
    return built.report.counts(), errors


def test_the_tuning_directory_is_made_at_the_tuned_size(tuned):
    assert [t["shape"] for t in load_tuning(tuned).meta.inputs] == [[1, 3, 48, 192]]


def test_records_tuned_at_one_width_schedule_the_kernels_of_every_width(models, tuned):
    """Each record's trace replays on the symbolic kernel it was tuned as (at W = 192): those kernels are
    "tuned" in the dynamic build, which matches ONNX Runtime at 32, 96, 192 and 256."""
    counts, errors = _build_and_compare(models["ppocr_cls"].path, tuned)
    assert counts.get("tuned", 0) >= 1, counts
    assert max(errors) < 1e-4, errors


def test_cli_tune_size_errors_and_a_build_outside_the_tuned_size(models, tuned, tmp_path):
    model = str(models["ppocr_cls"].path)
    result = run_cli("tune", model, "-p", PROFILE, "--input-shape", "x:1,3,48,W", "--trials", "1",
                     "-o", str(tmp_path / "t"))
    assert_clean_error(result, "which --tune-size gives no size", "--tune-size W=")
    result = run_cli("compile", model, "-p", PROFILE, "-o", str(tmp_path / "b"), "--input-shape", "x:1,3,48,W",
                     "--dim", "W=32..128:32", "--tuning", str(tuned))
    assert_clean_error(result, "tuned at W=192", "--tune-size W=32")
    built = json.loads(run_cli("compile", model, "-p", PROFILE, "-o", str(tmp_path / "ok"), "--input-shape",
                               "x:1,3,48,W", "--dim", *DIMS, "--tuning", str(tuned), "--json", check=True).stdout)
    assert built["dims"] == {"W": {"min": 32, "max": 256, "step": 32}} and built["tuning"]
