"""Versions: edgepack's own, and the one TVM release it is built and tested with (said once, here)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__version__ = "0.1.0"

#: The pinned compiler. The 0.2x TVM line moves APIs every release, and apache-tvm-ffi 0.1.15.post*
#: segfaults in ``tvm.ir.save_json`` (tuning databases need it): pyproject.toml pins the same pair.
TVM_VERSION = "0.27.0.post1"
TVM_FFI_VERSION = "0.1.14.post1"
PINNED_PACKAGES = {"apache-tvm": TVM_VERSION, "apache-tvm-ffi": TVM_FFI_VERSION}


def installed_version(package: str) -> str | None:
    """The installed version of a Python distribution, or None."""
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def installed_tvm() -> tuple[str, str]:
    """(apache-tvm, apache-tvm-ffi) as installed; "missing" for an absent one."""
    return (installed_version("apache-tvm") or "missing", installed_version("apache-tvm-ffi") or "missing")
