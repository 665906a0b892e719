"""Shared fixtures: the real test models (fetched once into the cache) and compiled builds; strict skips.

A test skips only for a reason outside the code it tests. With ``EDGEPACK_TEST_STRICT=1`` (CI sets it:
its machine has everything ``scripts/setup.sh`` installs) a skip is a failure, unless the test skipped
with :func:`skip_outside_setup` for something setup.sh does not install (an Android NDK, a real GPU).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from fetch_models import TestModel, ensure_models

STRICT = os.environ.get("EDGEPACK_TEST_STRICT") == "1"
OUTSIDE_SETUP = "outside scripts/setup.sh: "


def skip_outside_setup(reason: str) -> None:
    """Skip for something ``scripts/setup.sh`` does not install; the one skip strict mode allows."""
    pytest.skip(OUTSIDE_SETUP + reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if OUTSIDE_SETUP not in reason:
            report.outcome = "failed"
            report.longrepr = (f"skipped, but EDGEPACK_TEST_STRICT=1 says this machine has everything "
                               f"scripts/setup.sh installs: {reason}")


# Parallel runs (scripts/test.sh: pytest-xdist, ``--dist loadgroup``): each file runs whole in one worker,
# so its session fixtures (compiled builds) are made once; the files that drive the one SSH device farm
# (scripts/farm.sh: network namespaces and state under /var/lib) share a worker, so they never run at once.
# The longest files go first, so that no worker starts one near the end.
SHARED_FARM = {"test_devices.py", "test_farm.py", "test_gpu_device.py", "test_tuning.py"}
LONGEST_FIRST = ["test_tuning.py", "test_devices.py", "test_farm.py", "test_gpu_device.py", "test_dynamic_shapes.py",
                 "test_quantize.py", "test_opencl.py", "test_zoo.py", "test_vulkan.py", "test_bundle.py",
                 "test_android.py", "test_validation.py"]


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file keeps its own order
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("farm" if name in SHARED_FARM else name))


@pytest.fixture(scope="session")
def models() -> dict[str, TestModel]:
    return ensure_models()


@pytest.fixture(scope="session")
def build_cache(tmp_path_factory):
    """Compile each (model, profile) once per session; tests share the build directories."""
    from edgepack.compiling import compile_model

    root = tmp_path_factory.mktemp("builds")
    built: dict[tuple[str, str], Path] = {}

    def get(model: TestModel, profile: str) -> Path:
        key = (model.name, profile)
        if key not in built:
            out = root / f"{model.name}-{profile}"
            compile_model(model.path, profile, out, input_shapes=model.input_shapes)
            built[key] = out
        return built[key]

    return get


def validate_real_model(build: Path, on: str, model: TestModel, *, seed: int = 0, threads: int | None = None):
    """Validate a real model's build ``on`` a place with seeded random inputs (where the model takes them)
    and with its natural input (a photo, a text line, speech): every report passes, and at least one has
    a reference output that can show a wrong build (``ValidationReport.degenerate`` is False)."""
    from edgepack.validation import validate

    reports = []
    if model.random_inputs:
        reports.append(validate(build, on, seed=seed, threads=threads))
    if model.natural is not None:
        reports.append(validate(build, on, inputs=model.natural, threads=threads))
    assert reports, f"{model.name} has neither random nor natural inputs"
    for report in reports:
        assert report.passed, report.to_dict()
    assert any(not r.degenerate for r in reports), [r.to_dict() for r in reports]
    return reports


def run_cli(*args: str, check: bool = False, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real `edgepack` console script."""
    import os

    full_env = dict(os.environ, COLUMNS="200", **(env or {}))
    result = subprocess.run([sys.executable, "-m", "edgepack", *args], capture_output=True, text=True,
                            env=full_env, timeout=900, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"edgepack {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def assert_clean_error(result: subprocess.CompletedProcess, *needles: str, code: int = 2) -> None:
    """A user error: the expected exit code, a readable message, never a traceback."""
    text = result.stdout + result.stderr
    assert result.returncode == code, text
    assert "Traceback" not in text, text
    flat = " ".join(text.replace("\u2502", " ").split())  # the error panel's borders, where a line wraps
    for needle in needles:
        assert needle in flat, f"{needle!r} not in:\n{text}"
