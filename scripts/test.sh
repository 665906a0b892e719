#!/usr/bin/env bash
# Run edgepack's whole test suite (slow end-to-end tests included), setting up first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTHON="${PYTHON:-python3}"
"$PYTHON" scripts/fetch_models.py
exec "$PYTHON" -m pytest "$@"
