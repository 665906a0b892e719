"""Shared fixtures: the real test models (fetched once into the cache) and compiled builds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from fetch_models import TestModel, ensure_models


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
    flat = " ".join(text.split())
    for needle in needles:
        assert needle in flat, f"{needle!r} not in:\n{text}"
