"""Compiling the Java API with the JDK (``javac`` against android.jar or edgepack's stubs) into a jar."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from edgepack.errors import ToolchainError
from edgepack.files import atomic_file
from edgepack.packaging.android.java import android_stub_sources
from edgepack.progress import Progress
from edgepack.versions import __version__

JAVA_RELEASE = "8"  # classes.jar bytecode: what every Android toolchain (D8) accepts


def _java_tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).is_file():
        return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if not found:
        raise ToolchainError(f"The Java tool {name} is not installed (needed to build the Java API).",
                             "Install a JDK 11 or newer: `apt-get install openjdk-17-jdk-headless`"
                             " (or set JAVA_HOME).")
    return found


def jdk_include_dirs() -> tuple[Path, ...]:
    """``<jdk>/include`` and ``<jdk>/include/linux`` (jni.h, jni_md.h) of the JDK providing javac."""
    home = Path(os.path.realpath(_java_tool("javac"))).parent.parent
    include = home / "include"
    if not (include / "jni.h").is_file():
        raise ToolchainError(f"The JDK at {home} has no include/jni.h.",
                             "Install a full JDK (openjdk-17-jdk-headless), not only a JRE.")
    return (include, include / "linux")


def compile_java(
    sources: Mapping[str, str] | Iterable[Path],
    out_dir: Path,
    classpath: Sequence[Path] = (),
    *,
    release: str = JAVA_RELEASE,
    werror: bool = False,
    log: Progress | None = None,
) -> Path:
    """Compile Java sources with the real ``javac --release 8`` into ``out_dir`` (returned).

    ``sources`` is either a mapping of relative path -> text (written to a temp tree) or files.
    """
    javac = _java_tool("javac")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgepack-java-") as tmp:
        if isinstance(sources, Mapping):
            files = []
            for rel, text in sources.items():
                path = Path(tmp) / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
                files.append(path)
        else:
            files = [Path(p) for p in sources]
        cmd = [javac, "--release", release, "-encoding", "UTF-8", "-Xlint:all", "-Xlint:-options",
               *(["-Werror"] if werror else []), "-d", str(out_dir)]
        if classpath:
            cmd += ["-cp", os.pathsep.join(str(p) for p in classpath)]
        cmd += [str(f) for f in files]
        if log:
            log("$ " + " ".join(cmd[:12]) + (" ..." if len(cmd) > 12 else ""))
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ToolchainError("Compiling the Java API with javac failed.",
                             "The compiler said:\n" + "\n".join((result.stderr + result.stdout).strip().splitlines()[-25:]))
    return out_dir


def make_jar(classes_dir: Path, jar_path: Path, *, packages: Sequence[str] | None = None) -> Path:
    """A jar of the ``.class`` files under ``classes_dir`` (only ``packages`` when given), written
    deterministically with Python's zipfile."""
    classes_dir, jar_path = Path(classes_dir), Path(jar_path)
    prefixes = tuple(p.replace(".", "/") + "/" for p in packages) if packages else None
    entries = sorted(p for p in classes_dir.rglob("*.class")
                     if prefixes is None or p.relative_to(classes_dir).as_posix().startswith(prefixes))
    with atomic_file(jar_path) as tmp, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as jar:
        zip_write(jar, "META-INF/MANIFEST.MF", f"Manifest-Version: 1.0\r\nCreated-By: edgepack {__version__}\r\n\r\n")
        for path in entries:
            zip_write(jar, path.relative_to(classes_dir).as_posix(), path.read_bytes())
    return jar_path


def zip_write(z: zipfile.ZipFile, name: str, data: bytes | str) -> None:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    z.writestr(info, data)


def find_android_jar() -> Path | None:
    """``platforms/android-<N>/android.jar`` of the SDK in ``$ANDROID_HOME``/``$ANDROID_SDK_ROOT``."""
    for var in ("ANDROID_HOME", "ANDROID_SDK_ROOT"):
        root = os.environ.get(var)
        if not root:
            continue
        jars = list(Path(root).expanduser().glob("platforms/android-*/android.jar"))
        numbered = [(int(m.group(1)), j) for j in jars if (m := re.fullmatch(r"android-(\d+)", j.parent.name))]
        if numbered:
            return max(numbered)[1]
    return None


def compile_java_api(sources: Mapping[str, str], work: Path, *, android_jar: Path | None = None,
                     log: Progress | None = None) -> tuple[Path, Path]:
    """Compile the API against ``android_jar`` (else edgepack's stubs of the few Android classes it
    uses) into ``work/classes``; returns (classes dir, classpath entry used)."""
    work = Path(work)
    if android_jar is None:
        classpath = compile_java(android_stub_sources(), work / "android-stubs", log=log)
    else:
        classpath = Path(android_jar)
    return compile_java(sources, work / "classes", [classpath], log=log), classpath


