"""Estimate how fast an ARM build's multiply-add loops run on its CPU, where no such CPU is at hand.

A build for rpi4 or rpi3 cannot be timed here (qemu's speed says nothing about a Cortex-A72's), so this
reads the device library's code instead: every innermost loop (a backward branch with no other inside it)
that multiplies, its multiply-adds per iteration counted from the instructions (integer: ``mla``/``mul``
.4s 4, ``smull``/``vmull.s8`` 8, ``sdot`` 16, ``smmla`` 32; float with ``--kind float``: ``fmla`` .4s 4), and its cycles per iteration from LLVM's
machine-code analyser (``llvm-mca``, the ``llvm`` package) with the CPU's scheduling model. The result is
multiply-adds per cycle: a comparison of two builds' kernels, not a prediction of a model's time (memory,
loop overheads outside the innermost loops and threads are not in it).

    python scripts/arm_loop_estimate.py build/rpi4 [other builds...] [--mcpu cortex-a72] [--loops]

LLVM has no Cortex-A53 model for armv7 code; rpi3 builds are estimated as Cortex-A57 (``--mcpu``).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

TOOLS = {"aarch64": ("aarch64-linux-gnu-objdump", "aarch64", "cortex-a72"),
         "arm": ("arm-linux-gnueabihf-objdump", "armv7a", "cortex-a57")}
#: (pattern, multiply-adds, kind) of the instructions counted
MACS = [(re.compile(r"^[su]mull2?$|^[su]mlal2?$|^vmull\.[su]8$|^vmlal\.[su]8$"), 8, "integer"),
        (re.compile(r"^[su]dot$"), 16, "integer"), (re.compile(r"^[su]mmla$"), 32, "integer"), (re.compile(r"^mla$|^mul$|^vmla\.i32$|^vmul\.i32$"), 4, "integer"),
        (re.compile(r"^fmla$|^fmul$|^vmla\.f32$|^vmul\.f32$|^vfma\.f32$"), 4, "float")]
BRANCH = re.compile(r"^(b|b\.\w+|b(eq|ne|lt|gt|le|ge|hi|ls|cc|cs|mi|pl)|cbn?z|tbn?z)$")


def _macs(op: str, args: str, kind: str) -> int:
    if (op in ("mla", "mul", "fmla", "fmul") and ".4s" not in args) \
            or (op.startswith(("vmla.", "vmul.", "vfma.")) and not args.startswith("q")):
        return 0  # scalar or 64-bit forms
    return next((n for pattern, n, k in MACS if pattern.match(op) and k == kind), 0)


def loops(library: Path, objdump: str) -> list[list[tuple[str, str]]]:
    """The library's innermost loops, each as its (mnemonic, operands) lines."""
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(library)], check=True, capture_output=True,
                          text=True).stdout
    code = [(int(m.group(1), 16), m.group(2), m.group(3).split("@")[0].split("//")[0].strip())
            for m in (re.match(r"\s+([0-9a-f]+):\t(\S+)\s*(.*)", line) for line in text.splitlines()) if m]
    at = {address: i for i, (address, _, _) in enumerate(code)}
    spans = []
    for i, (address, op, args) in enumerate(code):
        target = re.match(r"([0-9a-f]+)", args.split(",")[-1].strip()) if BRANCH.match(op) else None
        if target and int(target.group(1), 16) < address and int(target.group(1), 16) in at:
            spans.append((at[int(target.group(1), 16)], i))
    inner = [(s, e) for s, e in spans if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in spans)]
    return [[(op, re.sub(r"<.*?>", "", args)) for _, op, args in code[s:e] if not BRANCH.match(op)] for s, e in inner]


def estimate(library: Path, arch: str, mcpu: str | None = None, kind: str = "integer") -> dict:
    """Multiply-adds per cycle of ``library``'s innermost loops of ``kind`` ("integer" or "float")."""
    objdump, triple, default_cpu = TOOLS[arch]
    rows = []
    for body in loops(library, objdump):
        macs = sum(_macs(op, args, kind) for op, args in body)
        if macs < 16:
            continue
        asm = "\n".join(f"{op} {args}" for op, args in body)
        out = subprocess.run(["llvm-mca", f"-mtriple={triple}", f"-mcpu={mcpu or default_cpu}", "-iterations=100"],
                             input=asm, capture_output=True, text=True, check=False).stdout
        cycles = re.search(r"Total Cycles:\s+(\d+)", out)
        if cycles:
            rows.append({"instructions": len(body), "macs": macs, "cycles": int(cycles.group(1)) / 100})
    macs, cycles = sum(r["macs"] for r in rows), sum(r["cycles"] for r in rows)
    return {"cpu": mcpu or default_cpu, "loops": rows, "macs_per_cycle": macs / cycles if cycles else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builds", nargs="+", type=Path)
    parser.add_argument("--mcpu", help="LLVM CPU name (default: cortex-a72 for aarch64, cortex-a57 for armv7)")
    parser.add_argument("--kind", choices=["integer", "float"], default="integer",
                        help="the multiply-adds counted (default: integer, the 8-bit kernels')")
    parser.add_argument("--loops", action="store_true", help="print every loop")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if shutil.which("llvm-mca") is None:
        raise SystemExit("llvm-mca is not installed: it comes with LLVM (apt-get install llvm)")
    results = {}
    for build in args.builds:
        library = build / "device" / "model.so"
        header = subprocess.run(["file", "-L", str(library)], capture_output=True, text=True, check=True).stdout
        arch = "aarch64" if "aarch64" in header else "arm" if "ARM" in header else None
        if arch is None:
            raise SystemExit(f"{library}: not an ARM library ({header.strip()})")
        results[str(build)] = result = estimate(library, arch, args.mcpu, args.kind)
        if not args.json:
            rate = result["macs_per_cycle"]
            print(f"{build}: {len(result['loops'])} {args.kind} multiply-add loops, "
                  f"{rate:.2f} multiply-adds per cycle on {result['cpu']}" if rate else f"{build}: no such loops")
            for row in result["loops"] if args.loops else []:
                print(f"  {row['instructions']:4d} instructions, {row['macs']:4d} multiply-adds, "
                      f"{row['cycles']:.1f} cycles")
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
