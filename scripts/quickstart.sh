#!/usr/bin/env bash
# Set everything up, then run edgepack's main job on its bundled default:
# a MobileNetV2-shaped ONNX model compiled for a Raspberry Pi 4 and validated against ONNX Runtime,
# on this machine and under emulation (the no-Python C runner under qemu-aarch64).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PYTHON="${PYTHON:-python3}"
mkdir -p build
[ -f build/mobilenetv2.onnx ] || "$PYTHON" scripts/make_mobilenetv2.py build/mobilenetv2.onnx
"$PYTHON" -m edgepack compile build/mobilenetv2.onnx --profile rpi4 -o build/rpi4 --force
"$PYTHON" -m edgepack validate build/rpi4 --on host
"$PYTHON" -m edgepack validate build/rpi4 --on emulator   # the C runner under qemu-aarch64, no Python
