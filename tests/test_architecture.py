"""The package's shape, checked from its source (AST): imports only go down the layers, nothing imports in a
cycle, no function-local import dodges one, and nothing outside ``edgepack/backends/`` asks which backend
it is dealing with by name.

    cli                     the command line (thin)
    edgepack (__init__)     the public Python API
    operations              compiling, validation, benchmark, inspection, packaging, tuning, doctor, quantizing
    run                     places to run a build (host, emulator, device, farm; the --on parser)
    devices                 SSH, installs, RPC servers, sessions, the farm
    backends                CPU, OpenCL, Vulkan behind one interface
    processing              pre-/post-processing compiled around a model, and its independent reference
    frontends, toolchain    model formats; compilers, runtimes, plug-ins
    basics                  errors, versions, paths, files, progress, tensors, dims, text, manifest, profiles, samples,
                            degenerate
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "edgepack"

LAYERS: list[set[str]] = [
    {"errors", "versions", "paths", "files", "progress", "tensors", "dims", "text", "manifest", "profiles", "samples",
     "degenerate"},
    {"frontends", "toolchain"},
    {"processing"},
    {"backends"},
    {"devices"},
    {"run"},
    {"compiling", "validation", "benchmark", "inspection", "packaging", "tuning", "doctor", "quantizing"},
    {"__init__"},
    {"cli", "__main__"},
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}
BACKEND_NAMES = {"cpu", "opencl", "vulkan", "webgpu", "llvm"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(module: str, name: str | None) -> str:
    """``from module import name``: the submodule ``module.name`` when there is one, else ``module``."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported edgepack module, line, at module level) for every import in the file (relative ones too)."""
    tree = ast.parse(path.read_text())
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top_level) for a in node.names if a.name.startswith("edgepack")]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            source = f"{base}.{node.module}" if node.module else base
            found += [(_resolve(source, a.name), node.lineno, id(node) in top_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edgepack"):
            found += [(_resolve(node.module, a.name), node.lineno, id(node) in top_level) for a in node.names]
    return found


def _imports_tvm_at_load(module: str, seen: set[str] | None = None) -> bool:
    """Whether importing ``module`` imports TVM: it does at its top level, or a module it imports there does."""
    seen = set() if seen is None else seen
    if module in seen:
        return False
    seen.add(module)
    tree = ast.parse(MODULES[module].read_text())
    for node in tree.body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(n == "tvm" or n.startswith("tvm.") for n in names):
            return True
    return any(_imports_tvm_at_load(t, seen) for t, _, top in _imports(MODULES[module]) if top and t in MODULES)


def test_every_module_belongs_to_a_layer():
    unknown = sorted({_unit(m) for m in MODULES} - set(RANK))
    assert not unknown, f"modules outside every layer (add them to LAYERS and docs/architecture.md): {unknown}"


def test_imports_only_go_down_the_layers():
    upward = []
    for module, path in MODULES.items():
        for target, line, _ in _imports(path):
            if target not in MODULES:
                continue
            if RANK[_unit(target)] > RANK[_unit(module)]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({_unit(module)}) imports {target} "
                              f"({_unit(target)})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_cycles():
    graph = {m: sorted({t for t, _, _ in _imports(p) if t in MODULES and t != m}) for m, p in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_function_local_import_of_edgepack_modules():
    """A function-local import is only for laziness: of a module that imports TVM when it loads (seconds),
    so that ``edgepack --help`` stays quick. Anything else goes at the top, where a cycle would show."""
    local = []
    for module, path in MODULES.items():
        for target, line, at_top in _imports(path):
            if not at_top and target in MODULES and not _imports_tvm_at_load(target):
                local.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} inside a function")
    assert not local, "\n".join(local)


def _backend_name_comparisons(path: Path) -> list[str]:
    found = []

    def names_in(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value} & BACKEND_NAMES
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(names_in(e) for e in node.elts)) if node.elts else set()
        return set()

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            hits = set().union(names_in(node.left), *(names_in(c) for c in node.comparators))
            if hits:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} compares with {sorted(hits)}")
    return found


def test_no_backend_name_comparisons_outside_backends():
    found = [hit for module, path in MODULES.items() if _unit(module) != "backends"
             for hit in _backend_name_comparisons(path)]
    assert not found, "ask the backend (edgepack.backends.backend_for) instead:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "if profile.backend == 'opencl': pass",
    "x = kind in ('opencl', 'vulkan')",
    "y = 'vulkan' != manifest.profile['backend']",
])
def test_the_backend_name_check_catches_comparisons(tmp_path, source):
    module = PACKAGE / "_probe_for_test.py"
    try:
        module.write_text(source + "\n")
        assert _backend_name_comparisons(module)
    finally:
        module.unlink(missing_ok=True)


def test_the_layer_check_catches_an_upward_import():
    module = PACKAGE / "devices" / "_probe_for_test.py"
    try:
        module.write_text("from edgepack.compiling import compile_model\n")
        target, _line, _top = _imports(module)[0]
        assert RANK[_unit(target)] > RANK["devices"]
    finally:
        module.unlink(missing_ok=True)
