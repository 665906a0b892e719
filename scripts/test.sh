#!/usr/bin/env bash
# Run edgepack's whole test suite (slow end-to-end tests included) in parallel, setting up first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTHON="${PYTHON:-python3}"
"$PYTHON" scripts/fetch_models.py
# One worker per core, at most 4 (each holds a TVM and its compiles); EDGEPACK_TEST_WORKERS=0 runs serially.
# tests/conftest.py keeps each file in one worker and the farm's files in one.
WORKERS="${EDGEPACK_TEST_WORKERS:-$(( $(nproc) < 4 ? $(nproc) : 4 ))}"
exec "$PYTHON" -m pytest -n "$WORKERS" --dist loadgroup "$@"
