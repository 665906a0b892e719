"""C programs built against the C API and a triple's TVM runtime (the example runner, tests, the JNI layer)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edgepack.errors import ToolchainError
from edgepack.progress import Progress
from edgepack.toolchain.compilers import require_tool
from edgepack.toolchain.process import run, tail
from edgepack.toolchain.sources import C_API, c_api_sources, source_dir
from edgepack.toolchain.tvm_runtime import TargetRuntime


def build_c_program(
    runtime: TargetRuntime,
    out_path: Path,
    *,
    cc: str,
    source: Path | None = None,
    static: bool = False,
    model_archive: Path | None = None,
    extra_archives: Sequence[Path] = (),
    fully_static: bool = False,
    cflags: Sequence[str] | None = None,
    rpath: Sequence[str] | None = None,
    werror: bool = False,
    strip: bool = False,
    log: Progress | None = None,
) -> Path:
    """Compile ``source`` (default: the example runner ``runtimes/api/c/examples/main.c``) with the C API.

    Shared (default): links ``libtvm_runtime.so``/``libtvm_ffi.so`` of ``runtime``; the program
    loads a model library at run time. RUNPATH: ``rpath`` if given, else ``$ORIGIN`` and the
    runtime's lib dir. Static: links ``model_archive`` (from ``export_model_static``; optional,
    e.g. for the API test program) and the runtime archives with ``--whole-archive`` and the C++
    runtime statically; only libc/libm/libpthread/libdl stay dynamic unless ``fully_static``.
    Only the C compiler is used. ``cflags`` default to the flags the runtime was built with.
    """
    c_dir = source_dir(C_API)
    source = Path(source) if source is not None else c_dir / "examples" / "main.c"
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    require_tool(cc, runtime.triple)
    flags = list(cflags) if cflags is not None else list(runtime.cflags)
    compile_flags = ["-std=c11", "-O2", "-Wall", "-Wextra", *(["-Werror"] if werror else []), *flags,
                     "-I", c_dir / "include"]
    for inc in runtime.include_dirs:
        compile_flags += ["-I", inc]
    if static:
        if len(runtime.static_libs) != 2:
            raise ToolchainError(f"The {runtime.triple} runtime in {runtime.root} has no static archives.",
                                 "Call ensure_target_runtime(..., need_static=True).")
        # extra_archives: GPU runtime plug-ins (libtvm_opencl.a), registered by static initialisers too
        archives = ([model_archive] if model_archive is not None else []) + list(extra_archives) + \
            list(runtime.static_libs)
        sys_libs = (["-static", "-lstdc++", "-lpthread", "-ldl", "-lm"] if fully_static else
                    ["-Wl,-Bstatic", "-lstdc++", "-Wl,-Bdynamic", "-static-libgcc", "-lpthread", "-ldl", "-lm"])
        link = ["-Wl,--gc-sections", "-Wl,--whole-archive", *archives, "-Wl,--no-whole-archive", *sys_libs]
    else:
        if len(runtime.shared_libs) != 2:
            raise ToolchainError(f"The {runtime.triple} runtime in {runtime.root} has no shared libraries.")
        lib_dirs = list(dict.fromkeys(str(p.parent) for p in runtime.shared_libs))  # the host wheel has two
        paths = list(rpath) if rpath is not None else ["$ORIGIN", *lib_dirs]
        link = [*(f"-L{d}" for d in lib_dirs), "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi",
                "-Wl,--as-needed", "-lpthread", "-ldl", "-lm"]
        if paths:
            link.append("-Wl,-rpath," + ":".join(paths))
    if strip:
        link.append("-s")
    cmd = [cc, *compile_flags, source, *c_api_sources(), *link, "-o", out_path]
    result = run(cmd, log=log)
    if result.returncode != 0:
        raise ToolchainError(f"Building {out_path.name} with {Path(cc).name} failed.",
                             "The last lines of the compiler output:\n" + tail(result.stderr))
    if log and result.stderr.strip():
        log(result.stderr.strip())
    return out_path
