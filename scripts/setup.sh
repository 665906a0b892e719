#!/usr/bin/env bash
# Install everything edgepack needs on a Debian/Ubuntu machine. Idempotent: a second run is quick.
#   cross compilers (aarch64, armv7), qemu-user, cmake, sshd + iproute2 (the device farm), a JDK (JNI bindings),
#   PoCL (OpenCL on this CPU, for GPU profiles), lavapipe (Vulkan on this CPU, for Vulkan profiles);
#   edgepack itself (editable) with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(g++-aarch64-linux-gnu g++-arm-linux-gnueabihf qemu-user qemu-user-static binfmt-support
              cmake make file openssh-server iproute2 openjdk-17-jdk-headless
              pocl-opencl-icd ocl-icd-libopencl1 opencl-headers clinfo
              mesa-vulkan-drivers libvulkan1 vulkan-tools)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "==> apt-get install ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# ARM binaries can run directly when binfmt_misc is mounted (the SSH device farm needs it);
# edgepack itself calls qemu explicitly, so a failure here is not fatal.
if [ ! -e /proc/sys/fs/binfmt_misc/status ] && [ "$(id -u)" -eq 0 ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null || true
fi
if command -v update-binfmts >/dev/null && [ "$(id -u)" -eq 0 ]; then
  update-binfmts --enable qemu-aarch64 2>/dev/null || true
  update-binfmts --enable qemu-arm 2>/dev/null || true
fi

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import edgepack, tvm, onnxruntime, ai_edge_litert, lz4, pytest, xdist, PIL, xgboost, tornado" 2>/dev/null \
   || [ pyproject.toml -nt "$("$PYTHON" -c 'import edgepack,os;print(os.path.dirname(edgepack.__file__))')" ]; then
  echo "==> pip install -e .[test,tune]"
  "$PYTHON" -m pip install -q --disable-pip-version-check -e ".[test,tune]"
fi
# wgpu-native (pinned PyPI wgpu wheel, SHA-256 checked) for Vulkan builds: fetched into edgepack's cache
# now, while online, rather than in the middle of a test run. Not fatal offline.
"$PYTHON" -c "from edgepack.toolchain.wgpu_native import WGPU_WHEELS, wgpu_native; [wgpu_native(t) for t in WGPU_WHEELS]" 2>/dev/null \
  || echo "==> note: wgpu-native (PyPI wgpu==0.32.0) could not be fetched now; Vulkan profiles fetch it on first use"
echo "==> edgepack $("$PYTHON" -m edgepack --version | cut -d' ' -f2) ready"
