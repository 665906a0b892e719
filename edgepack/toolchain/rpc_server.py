"""edgepack's RPC server (``runtimes/rpc-server``: plain C over TVM's runtime, no Python; the C API's
``edgepack.c`` compiled in for the run-time functions models call) built for a triple, with the runtime
libraries and any GPU plug-ins it loads in the same directory.

The same bundle is installed on devices over SFTP and run on this machine for host GPU tuning: the
program finds ``libtvm_runtime``/``libtvm_ffi`` through ``RUNPATH $ORIGIN`` and loads the plug-ins
(``libtvm_opencl.so`` ...) it finds beside itself at start-up.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgepack.errors import ToolchainError
from edgepack.files import cached_directory, file_sha256
from edgepack.paths import cache_root
from edgepack.progress import Progress
from edgepack.toolchain.compilers import compiler_identity
from edgepack.toolchain.process import run, tail
from edgepack.toolchain.sources import C_API, RPC_SERVER, c_api_files, c_api_sources, source_dir
from edgepack.toolchain.tvm_runtime import TargetRuntime
from edgepack.versions import TVM_VERSION

SERVER_PROGRAM = "edgepack_rpc_server"
RUNTIME_LIBS = ("libtvm_ffi.so", "libtvm_runtime.so")
INSTALL_MANIFEST = "install.json"


@dataclass(frozen=True)
class ServerBundle:
    """The files of one RPC server install: the runtime libraries, plug-ins and the server program."""

    triple: str
    directory: Path
    manifest: dict[str, Any]  # tvm_version, server_version, triple, files {name: sha256}

    @property
    def files(self) -> tuple[Path, ...]:
        return tuple(self.directory / name for name in self.manifest["files"])

    @property
    def program(self) -> Path:
        return self.directory / SERVER_PROGRAM


def server_source() -> Path:
    return source_dir(RPC_SERVER) / f"{SERVER_PROGRAM}.c"


def server_version() -> str:
    for line in server_source().read_text().splitlines():
        if line.startswith("#define EP_VERSION"):
            return line.split('"')[1]
    return "unknown"


def server_bundle(triple: str, cc: str, runtime: TargetRuntime, plugins: Mapping[str, Path] | None = None, *,
                  log: Progress | None = None) -> ServerBundle:
    """The RPC server for ``triple`` compiled with ``cc`` against ``runtime``, with the runtime's shared
    libraries and ``plugins`` ({file name: path}) beside it; built once and cached."""
    plugins = dict(plugins or {})
    source = server_source()
    libs = {lib.name: lib for lib in runtime.shared_libs}
    missing = [name for name in RUNTIME_LIBS if name not in libs]
    if missing:
        raise ToolchainError(f"The {triple} TVM runtime in {runtime.root} lacks {', '.join(missing)}.",
                             "Remove that directory so that edgepack fetches or builds it again.")
    c_api = source_dir(C_API)
    key_data = {
        "source": file_sha256(source),
        "c_api": [file_sha256(path) for path in c_api_files()],
        "libs": {name: file_sha256(libs[name]) for name in RUNTIME_LIBS},
        "plugins": {name: file_sha256(path) for name, path in plugins.items()},
        "cc": compiler_identity(cc),
        "cflags": list(runtime.cflags),
    }
    key = hashlib.sha256(json.dumps(key_data, sort_keys=True).encode()).hexdigest()[:12]
    base = cache_root() / "rpc-server" / TVM_VERSION
    base.mkdir(parents=True, exist_ok=True)

    def make(staging: Path) -> None:
        if log:
            log(f"Building the RPC server for {triple}")
        for name, path in [*((n, libs[n]) for n in RUNTIME_LIBS), *plugins.items()]:
            shutil.copy2(path, staging / name)
            (staging / name).chmod(0o755)
        exe = staging / SERVER_PROGRAM
        includes = (c_api / "include", c_api / "src", *runtime.include_dirs)
        cmd = [cc, "-std=c11", "-O2", "-Wall", "-Wextra", *runtime.cflags, *[f"-I{d}" for d in includes],
               "-o", str(exe), str(source), *map(str, c_api_sources()), f"-L{staging}",
               "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi", "-Wl,--as-needed", "-lpthread", "-ldl",
               "-Wl,-rpath,$ORIGIN", "-s"]
        result = run(cmd, timeout=600)
        if result.returncode != 0:
            raise ToolchainError(
                f"Building the RPC server for {triple} with {Path(cc).name} failed.",
                "The last lines of the compiler output:\n" + tail(result.stderr or result.stdout),
            )
        manifest = {
            "tvm_version": TVM_VERSION,
            "server_version": server_version(),
            "triple": triple,
            "runtime_origin": runtime.origin,
            "files": {name: file_sha256(staging / name) for name in (*RUNTIME_LIBS, SERVER_PROGRAM, *plugins)},
        }
        (staging / INSTALL_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")

    final = cached_directory(base / f"{triple}-{key}", make, complete=lambda p: (p / INSTALL_MANIFEST).is_file())
    return ServerBundle(triple, final, json.loads((final / INSTALL_MANIFEST).read_text()))
