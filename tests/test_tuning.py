"""Tuning (edgepack.tuning, `edgepack tune`, `edgepack tuning show`, `compile --tuning`).

Fast tests use hand-written tuning directories (no measurement). The slow ones tune a real model
for a handful of trials on this machine, interrupt it (Ctrl-C, then SIGKILL), resume it, check that
no finished measurement was lost or redone, compile with the records and validate against ONNX
Runtime; and do the same through the RPC tracker of a farm of emulated aarch64 devices.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import assert_clean_error, run_cli

from edgepack.tuning import (
    TuningError,
    TuningMismatchError,
    load_tuning,
    parse_duration,
    repair_database,
    write_best_records,
)
from edgepack.tuning.records import LOCK_FILE, RECORD_FILE, WORKLOAD_FILE

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# hand-written tuning directories


def _record(workload: int, seconds: float | None) -> str:
    run_secs = [seconds, seconds] if seconds is not None else [1e10]
    return json.dumps([workload, [[[], []], run_secs, {"kind": "llvm"}, []]]) + "\n"


def _fake_dir(root: Path, records: list[tuple[int, float | None]]) -> Path:
    """Two tasks: conv (weight 2, workload 0) and add (weight 1, workload 1)."""
    root.mkdir(parents=True, exist_ok=True)
    meta = {"model_name": "m.onnx", "model_sha256": "ab" * 32, "model_format": "onnx",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8]}], "profile": "host",
            "target": {"kind": "llvm"}, "tuning_target": {"kind": "llvm", "num-cores": 2},
            "tvm_version": "0.27.0.post1", "tvm_ffi_version": "0.1.14.post1", "edgepack_version": "0.1.0",
            "created": "2026-01-01T00:00:00+00:00"}
    tasks = {"tasks": [{"name": "fused_conv", "workload": "111", "weight": 2, "flop": 2e6},
                       {"name": "add", "workload": "222", "weight": 1, "flop": 0.0}]}
    (root / "tuning.json").write_text(json.dumps(meta))
    (root / "tasks.json").write_text(json.dumps(tasks))
    (root / WORKLOAD_FILE).write_text('["111","AAAA"]\n["222","BBBB"]\n')
    (root / RECORD_FILE).write_text("".join(_record(w, s) for w, s in records))
    return root


def test_records_apply_only_where_they_beat_the_default_schedule(tmp_path):
    from edgepack.tuning.records import best_records, record_default

    d = _fake_dir(tmp_path / "t", [(0, 0.004), (0, 0.002), (1, 0.001)])
    record_default(d, "111", "cpu.Conv2D", 0.003)  # conv: the best record (2 ms) beats its default (3 ms)
    record_default(d, "222", "cpu.Injective", 0.001)  # add: its only record is the default itself
    summary = load_tuning(d)
    conv, add = summary.tasks
    assert (conv.default_rule, conv.default_seconds, conv.tuned) == ("cpu.Conv2D", 0.003, True)
    assert conv.speedup == pytest.approx(1.5)
    assert not add.tuned and summary.tuned_tasks == 1
    workloads, records = best_records(d)
    assert [w[0] for w in workloads] == ["111"] and len(records) == 1  # the add keeps its default schedule
    table = run_cli("tuning", "show", str(d), check=True).stdout
    assert "1.50x" in table and "default" in table and "1 task(s) keep their default schedule" in table


def test_a_record_that_loses_inside_the_model_is_not_applied(tmp_path):
    """Timed alone the record beats the default; inside the model it does not, at one of the thread
    counts checked: the build keeps the default. A verdict taken for an older best record does not count
    for a newer one; a directory whose check recorded no thread count still reads."""
    from edgepack.tuning.records import DEFAULTS_FILE, InModelTime, record_default, record_in_model

    d = _fake_dir(tmp_path / "t", [(0, 0.002), (1, 0.001)])
    record_default(d, "111", "cpu.Conv2D", 0.003)
    record_default(d, "222", "cpu.Matmul", 0.004)
    conv_times = (InModelTime(2, 0.0025, 0.0020), InModelTime(1, 0.0040, 0.0047))  # loses at 1 thread
    matmul_times = (InModelTime(2, 0.005, 0.004), InModelTime(1, 0.009, 0.007))
    record_in_model(d, {"111": (0.002, conv_times), "222": (0.001, matmul_times)})
    conv, matmul = load_tuning(d).tasks
    assert conv.in_model == conv_times and conv.lost_in_model and not conv.tuned
    assert matmul.in_model == matmul_times and matmul.tuned
    table = " ".join(run_cli("tuning", "show", str(d), check=True).stdout.split())
    assert "default*" in table and "ran slower inside the model" in table
    shown = {t["workload"]: t for t in json.loads(run_cli("tuning", "show", str(d), "--json", check=True).stdout)["tasks"]}
    assert shown["111"]["in_model"][1] == {"threads": 1, "default": 0.004, "tuned": 0.0047}
    assert shown["111"]["lost_in_model"] and not shown["111"]["tuned"] and shown["222"]["tuned"]
    record_in_model(d, {"111": (0.0021, conv_times)})  # checked for another record than the best
    assert load_tuning(d).tasks[0].in_model is None and load_tuning(d).tasks[0].tuned
    # the release that checked one thread count wrote one pair of times and no count
    defaults = json.loads((d / DEFAULTS_FILE).read_text())
    defaults["111"]["in_model"] = {"default": 0.0025, "tuned": 0.0031, "record_seconds": 0.002}
    (d / DEFAULTS_FILE).write_text(json.dumps(defaults))
    conv = load_tuning(d).tasks[0]
    assert conv.in_model == (InModelTime(None, 0.0025, 0.0031),) and not conv.tuned


def test_older_directories_keep_the_kernel_form_they_were_tuned_with(tmp_path):
    """A directory made before a kernel-forming choice existed says nothing of it: its records were
    tuned on kernels formed without it (NCHW, no weight prepacking, direct 3x3 convolutions), and a
    build with them forms its kernels the same way."""
    from edgepack.backends import KernelForm
    from edgepack.tuning.records import TuningMeta

    assert load_tuning(_fake_dir(tmp_path / "old", [(0, 0.002)])).meta.form == KernelForm()
    data = json.loads((tmp_path / "old" / "tuning.json").read_text())
    first = TuningMeta.from_dict(data | {"weight_prepack": True, "channels_last": True, "winograd": True})
    assert first.form == KernelForm(weight_prepack=True, channels_last=True, winograd=2)  # F(2x2, 3x3) only
    newer = TuningMeta.from_dict(data | {"weight_prepack": True, "channels_last": True, "winograd": 4})
    assert newer.form == KernelForm(weight_prepack=True, channels_last=True, winograd=4)


def test_parse_duration():
    assert parse_duration("30m") == 1800
    assert parse_duration("1h30m") == 5400
    assert parse_duration("90s") == parse_duration("90") == parse_duration(90) == 90
    assert parse_duration(None) is None
    for bad in ("soon", "30x", "m30", ""):
        with pytest.raises(TuningError, match="Cannot read the duration"):
            parse_duration(bad)


def test_load_tuning_counts_best_and_share(tmp_path):
    d = _fake_dir(tmp_path / "t", [(0, 0.004), (0, 0.002), (0, None), (1, 0.001), (0, 0.003)])
    summary = load_tuning(d)
    conv, add = summary.tasks
    assert (conv.trials, conv.failed, conv.best_seconds) == (4, 1, 0.002)
    assert (add.trials, add.failed, add.best_seconds) == (1, 0, 0.001)
    # share of model time: weight x best latency
    assert conv.share == pytest.approx(0.004 / 0.005) and add.share == pytest.approx(0.001 / 0.005)
    assert summary.trials == 5 and summary.tuned_tasks == 2
    assert summary.estimated_seconds == pytest.approx(0.005)
    assert conv.gflops == pytest.approx(2e6 / 0.002 / 1e9)


def test_a_torn_last_line_is_ignored_then_repaired(tmp_path):
    d = _fake_dir(tmp_path / "t", [(0, 0.004), (1, 0.001)])
    with open(d / RECORD_FILE, "a") as f:
        f.write(_record(0, 0.001)[:40])  # the tuner was killed while appending this record
    summary = load_tuning(d)
    assert summary.trials == 2 and summary.ignored_lines == 1
    assert summary.tasks[0].best_seconds == 0.004  # the torn record does not count
    assert repair_database(d) == [f"dropped a torn last line of {RECORD_FILE}"]
    assert (d / RECORD_FILE).read_text() == _record(0, 0.004) + _record(1, 0.001)
    assert repair_database(d) == []  # idempotent
    assert load_tuning(d).ignored_lines == 0


def test_a_torn_workload_line_and_damaged_records_are_repaired(tmp_path):
    d = _fake_dir(tmp_path / "t", [(0, 0.004)])
    with open(d / WORKLOAD_FILE, "a") as f:
        f.write('["333","CC')
    with open(d / RECORD_FILE, "a") as f:
        f.write("not json\n" + _record(1, 0.001) + _record(7, 0.001))  # 7: no such workload
    done = repair_database(d)
    assert done[0] == f"dropped a torn last line of {WORKLOAD_FILE}"
    assert "without 2 unreadable lines" in done[1]
    lines = [json.loads(line) for line in (d / RECORD_FILE).read_text().splitlines()]
    assert lines == [json.loads(_record(0, 0.004)), json.loads(_record(1, 0.001))]
    assert list(d.glob(f"{RECORD_FILE}.damaged-*"))  # the original is kept


def test_unreadable_workloads_in_the_middle_are_refused(tmp_path):
    d = _fake_dir(tmp_path / "t", [(0, 0.004)])
    (d / WORKLOAD_FILE).write_text('["111","AAAA"]\ngarbage\n["222","BBBB"]\n')
    with pytest.raises(TuningError, match="unreadable lines in the middle"):
        repair_database(d)


def test_best_records_copy(tmp_path):
    d = _fake_dir(tmp_path / "t", [(0, 0.004), (0, 0.002), (1, None), (0, 0.003)])
    assert write_best_records(d, tmp_path / "best") == 1  # task "add" has no valid record
    best = load_tuning(tmp_path / "best")
    assert [(t.trials, t.best_seconds) for t in best.tasks] == [(1, 0.002), (0, None)]
    assert (tmp_path / "best" / WORKLOAD_FILE).read_text() == '["111","AAAA"]\n'


def test_a_schedule_is_known_by_the_same_key_before_and_after_it_is_written(tmp_path):
    """A candidate's trace holds booleans (a layout-rewrite annotation: True); the records file gives
    them back as 0/1, which replayed to another program: a resumed run recognised none of the schedules
    it had measured and measured one again (CI: 40 records, 39 distinct)."""
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord

    from edgepack.tuning.search import replay, schedule_hash

    a, b = te.placeholder((16, 16), name="a"), te.placeholder((16, 16), name="b")
    k = te.reduce_axis((0, 16), name="k")
    c = te.compute((16, 16), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    sch = Schedule(mod)
    block = sch.get_sblock("c")
    sch.annotate(block, "meta_schedule.layout_rewrite_preproc", True)
    sch.split(sch.get_loops(block)[1], [None, 4])

    database = JSONDatabase(path_workload=str(tmp_path / WORKLOAD_FILE), path_tuning_record=str(tmp_path / RECORD_FILE))
    workload = database.commit_workload(mod)
    database.commit_tuning_record(TuningRecord(sch.trace, workload, [1e-3], tvm.target.Target({"kind": "llvm"}),
                                               ArgInfo.from_prim_func(mod["main"])))
    [written] = JSONDatabase(path_workload=str(tmp_path / WORKLOAD_FILE),
                             path_tuning_record=str(tmp_path / RECORD_FILE)).get_all_tuning_records()
    assert schedule_hash(replay(mod, sch.trace).mod) == schedule_hash(replay(written.workload.mod, written.trace).mod)


def test_recorded_schedules_are_known_to_their_own_kernel(tmp_path):
    """Records of two kernels in one database: each kernel's plan gets exactly its own (a resumed run
    must not measure a recorded schedule again, nor warm-start one kernel's cost model on another's)."""
    import tvm
    import tvm_ffi
    from tvm import te
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.database import JSONDatabase, TuningRecord
    from tvm.target import Target

    from edgepack.tuning import TuningTask
    from edgepack.tuning.search import load_known, replay, schedule_hash

    def kernel(n: int):
        a = te.placeholder((n,), name="a")
        return tvm.IRModule({"main": te.create_prim_func([a, te.compute((n,), lambda i: a[i] * 2.0)])})

    database = JSONDatabase(path_workload=str(tmp_path / "w.json"), path_tuning_record=str(tmp_path / "r.json"))
    target = Target("llvm")
    expected = {}
    for n, factors in ((64, (2, 4, 8, 16, 32)), (128, (4, 16, 2, 8, 64)), (256, (8, 32, 2, 4))):
        mod = kernel(n)
        workload = database.commit_workload(mod)
        for factor in factors:
            sch = Schedule(mod)
            sch.split(sch.get_loops(sch.get_sblock("compute"))[0], [None, factor])
            database.commit_tuning_record(TuningRecord(sch.trace, workload, [1e-6 * factor], target,
                                                       ArgInfo.from_prim_func(mod["main"])))
            expected.setdefault(str(tvm_ffi.structural_hash(mod)), set()).add(
                schedule_hash(replay(mod, sch.trace).mod))
    reopened = JSONDatabase(path_workload=str(tmp_path / "w.json"), path_tuning_record=str(tmp_path / "r.json"))
    known = load_known(reopened, [TuningTask(f"t{i}", w, 1, 0.0) for i, w in enumerate(expected)])
    assert {w: {digest for _r, _s, digest, _sch in entries} for w, entries in known.items()} == expected


def test_cpu_kernels_are_tuned_channels_last(models):
    """New CPU tuning directories tune NHWC convolutions: ReLU6, residual adds and pooling follow the
    convolutions into NHWC, so only the model's input and its pooled features are transposed."""
    import tvm

    from edgepack.backends import KernelForm, get_backend
    from edgepack.frontends import import_model
    from edgepack.tuning import extract_tasks

    imported = import_model(models["mobilenetv2"].path)
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    tasks, extracted = extract_tasks(imported, get_backend("cpu"), target,
                                     KernelForm(weight_prepack=True, channels_last=True))
    convs = [t.dispatched[0].script() for t in extracted if "conv2d" in str(t.task_name)]
    assert len(convs) == 30  # 20 pointwise and full convolutions, 10 depthwise
    assert all('sblock("conv2d_nhwc")' in c or 'sblock("group_conv2d_nhwc")' in c for c in convs)
    transposes = [t.name for t in tasks if "transpose" in t.name]
    assert len(transposes) <= 2, transposes
    assert any("maximum" in t.name and "minimum" in t.name and "conv2d" in t.name for t in tasks)


def test_not_a_tuning_directory(tmp_path):
    with pytest.raises(TuningError, match="is not a tuning directory"):
        load_tuning(tmp_path)


def test_records_for_another_model_shape_or_target_are_refused(models, tmp_path):
    import tvm

    from edgepack.backends import backend_for
    from edgepack.frontends import import_model
    from edgepack.profiles import get_profile
    from edgepack.run.places import parse_place
    from edgepack.tuning import check_tuning
    from edgepack.tuning.tuner import _ensure_directory, _meta_for

    host = get_profile("host")
    backend = backend_for(host)
    cls = models["ppocr_cls"]
    imported = import_model(cls.path, cls.input_shapes)
    meta = _meta_for(imported, host, backend, backend.tuning_target(host, num_cores=2, here=True),
                     parse_place("host"))
    directory = tmp_path / "t"
    _ensure_directory(directory, meta, [])
    (directory / WORKLOAD_FILE).touch()
    (directory / RECORD_FILE).touch()

    assert check_tuning(directory, imported, host.tvm_target()).trials == 0  # the same: accepted

    with pytest.raises(TuningMismatchError, match="another target"):
        check_tuning(directory, imported, get_profile("rpi4").tvm_target())
    with pytest.raises(TuningMismatchError, match=r"other input shapes \(x:1,3,48,192, not x:1,3,48,320\)"):
        check_tuning(directory, import_model(cls.path, {"x": (1, 3, 48, 320)}), host.tvm_target())
    other = SimpleNamespace(info=SimpleNamespace(sha256="0" * 64), inputs=imported.inputs)
    with pytest.raises(TuningMismatchError, match="another model") as err:
        check_tuning(directory, other, tvm.target.Target({"kind": "llvm"}))
    assert "tune this one into its own directory" in err.value.hint


def test_tuning_show_cli(tmp_path):
    d = _fake_dir(tmp_path / "t", [(0, 0.004), (0, 0.002), (1, 0.001)])
    shown = run_cli("tuning", "show", str(d), "--json", check=True)
    data = json.loads(shown.stdout)
    assert data["trials"] == 3 and [t["trials"] for t in data["tasks"]] == [2, 1]
    table = run_cli("tuning", "show", str(d), check=True).stdout
    for needle in ("fused_conv", "share", "80.0%", "default", "3 trials; 2/2 tasks have a record faster than their default"):
        assert needle in table, table
    assert_clean_error(run_cli("tuning", "show", str(tmp_path / "nothing")), "is not a tuning directory")


def test_tune_refuses_what_it_cannot_measure(models, tmp_path):
    model = models["light_squeezenet"].path
    assert_clean_error(run_cli("tune", str(model), "--profile", "rpi4", "--on", "host", "-o", str(tmp_path / "a")),
                       "cannot be measured on this machine", "--on farm:rpi4")
    assert_clean_error(run_cli("tune", str(model), "--time-budget", "soon", "-o", str(tmp_path / "b")),
                       "Cannot read the duration")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    assert_clean_error(run_cli("tune", str(model), "-o", str(tmp_path / "c")), "is not a tuning directory")


# ---------------------------------------------------------------------------------------------
# real tuning on this machine


def _popen_cli(*args: str) -> subprocess.Popen:
    env = dict(os.environ, COLUMNS="200")
    return subprocess.Popen([sys.executable, "-m", "edgepack", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT, start_new_session=True)


def _record_lines(directory: Path) -> int:
    path = directory / RECORD_FILE
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _wait_for_records(directory: Path, count: int, proc: subprocess.Popen, timeout: float = 600) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = _record_lines(directory)
        if n >= count:
            return n
        if proc.poll() is not None:
            raise AssertionError(f"tune exited ({proc.returncode}) with {n} records:\n{proc.stdout.read()}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"fewer than {count} records after {timeout} s")


def _interrupt(proc: subprocess.Popen) -> str:
    """Ctrl-C ``proc`` once, as a terminal does (SIGINT to its process group: ``_popen_cli`` starts it in a
    session of its own), and wait for it to end; returns everything it printed. One press is enough:
    ``edgepack tune`` passes it on to the process that tunes as SIGUSR1, which Z3 (TVM's prover, whose
    solver takes SIGINT for moments at a time) leaves alone (``edgepack.tuning.signals``)."""
    os.killpg(proc.pid, signal.SIGINT)
    text, _ = proc.communicate(timeout=600)
    return text


def _wait_unlocked(directory: Path, timeout: float = 30) -> None:
    """Wait until no process holds the tuning directory's lock: a killed command's tuning process dies
    with it, a moment later."""
    import fcntl

    deadline = time.monotonic() + timeout
    with open(directory / LOCK_FILE, "a+") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, "the tuning process outlived its command"
                time.sleep(0.05)


def _distinct_schedules(directory: Path) -> tuple[int, int]:
    """(records, distinct (kernel, scheduled program) pairs): equal when nothing was measured twice."""
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir.meta_schedule.database import JSONDatabase

    database = JSONDatabase(path_workload=str(directory / WORKLOAD_FILE),
                            path_tuning_record=str(directory / RECORD_FILE))
    seen = set()
    records = database.get_all_tuning_records()
    for record in records:
        sch = Schedule(record.workload.mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        seen.add((tvm_ffi.structural_hash(record.workload.mod), tvm_ffi.structural_hash(sch.mod)))
    return len(records), len(seen)


def _wait_for_output(proc: subprocess.Popen, lines: list[str], needle: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while needle not in "".join(lines):
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.05)


def test_tune_ctrl_c_before_tuning_starts_and_twice(models, tmp_path):
    """`edgepack tune` tunes in a child process it relays Ctrl-C to (tuning.signals). Before any measurement
    one press ends the run at once (exit 130, a clear message); two presses kill the tuning process at once
    and the command dies of SIGINT, as a shell expects; no process is left behind either way."""
    import threading

    model = models["ppocr_cls"].path
    for presses in (1, 2):
        out = tmp_path / f"t{presses}"
        proc = _popen_cli("tune", str(model), "--input-shape", "x:1,3,48,192", "-o", str(out), "--trials", "8")
        lines: list[str] = []
        threading.Thread(target=lambda proc=proc, lines=lines: lines.extend(proc.stdout), daemon=True).start()
        _wait_for_output(proc, lines, "Extracting the tuning tasks")
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1, children  # the tuning process
        for _ in range(presses):
            os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.05)
        proc.wait(timeout=60)
        time.sleep(0.5)
        text = "".join(lines)
        assert "Traceback" not in text and "Internal error" not in text, text
        if presses == 1:
            assert proc.returncode == 130, text
            assert "Tuning was interrupted" in text and "Rerun the same command to resume" in " ".join(text.split())
        else:
            assert proc.returncode == -signal.SIGINT, text
            assert "Stopped at once" in text, text
        assert not Path(f"/proc/{children[0]}").exists() or \
            Path(f"/proc/{children[0]}/stat").read_text().split()[2] == "Z", "the tuning process outlived the command"


def test_tune_ctrl_c_twice_in_a_terminal(models, tmp_path):
    """In a terminal (a real pty: Ctrl-C is the terminal's, sent to the foreground process group), two
    presses stop the command at once, and it gives back the cursor that the tuning process's progress
    display had hidden, its last word on a line of its own."""
    import pty
    import select

    model = models["ppocr_cls"].path
    pid, master = pty.fork()
    if pid == 0:  # the child: the command, in the terminal
        try:
            os.chdir(ROOT)
            os.execvpe(sys.executable, [sys.executable, "-m", "edgepack", "tune", str(model), "--input-shape",
                                        "x:1,3,48,192", "-o", str(tmp_path / "t"), "--trials", "8"],
                       dict(os.environ, COLUMNS="120"))
        finally:
            os._exit(127)
    output, pressed, deadline = b"", False, time.monotonic() + 120
    while True:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            break
        if select.select([master], [], [], 0.1)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other end is closed: the command is gone
                break
            if not chunk:
                break
            output += chunk
        if not pressed and b"Extracting the tuning tasks" in output:
            for _ in range(2):  # the second within the ~0.5 s the first takes to end the run, not so soon
                os.write(master, b"\x03")  # after it that the two signals merge
                time.sleep(0.05)
            pressed = True
    _, status = os.waitpid(pid, 0)
    os.close(master)
    text = output.decode(errors="replace")
    assert pressed, text
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT, (status, text)
    assert "Traceback" not in text and "Stopped at once" in text, text
    assert output.rfind(b"\x1b[?25h") > output.rfind(b"\x1b[?25l"), text  # the cursor shown again
    assert re.search(r"\n\s*Stopped at once", text), text


@pytest.mark.slow
def test_tune_interrupt_resume_then_compile_and_validate(models, tmp_path):
    """Ctrl-C, then SIGKILL, then resume: every finished measurement is kept, none is redone."""
    from edgepack.compiling import compile_model
    from edgepack.frontends import run_reference
    from edgepack.packaging.c import package_c, run_bundle
    from edgepack.validation import validate

    model = models["ppocr_cls"]  # PP-OCR's text direction classifier: real weights, small kernels
    out = tmp_path / "tuning"
    batch, trials = 4, 16
    # its two heaviest convolutions (the second merged with the per-channel scaling before it): each first
    # measures its default schedule (a baseline in defaults.json, not a record), then gets a probe batch
    # (4), then batches of 4 revisit them
    command = ("tune", str(model.path), "--input-shape", "x:1,3,48,192", "--profile", "host", "--on", "host",
               "-o", str(out), "--trials", str(trials), "--batch", str(batch),
               "--task", "_conv2d36_", "--task", "_conv2d40_")

    # 1. Ctrl-C once the first batch is recorded: the batch in flight is finished and recorded, exit 130
    proc = _popen_cli(*command)
    _wait_for_records(out, 1, proc)
    text = _interrupt(proc)
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "Rerun the same command to resume" in " ".join(text.split())
    after_interrupt = (out / RECORD_FILE).read_bytes()
    n1 = _record_lines(out)
    assert n1 in (4, 8, 16), text  # whole batches only

    # 2. SIGKILL in the middle of the next run: what was recorded stays, byte for byte
    proc = _popen_cli(*command)
    _wait_for_records(out, n1 + batch, proc)
    proc.kill()  # the command: its tuning process dies with it
    proc.wait(timeout=60)
    _wait_unlocked(out)
    after_kill = (out / RECORD_FILE).read_bytes()
    assert after_kill.startswith(after_interrupt)
    n2 = _record_lines(out)
    assert n1 < n2 < trials

    # 3. the same command resumes and stops at the trial budget
    result = json.loads(run_cli(*command, "--json", check=True).stdout)
    assert result["trials_before"] == n2 and result["trials_run"] == trials - n2
    assert result["trials"] == trials and result["stopped"] == "trials"
    assert (out / RECORD_FILE).read_bytes().startswith(after_kill)
    records, distinct = _distinct_schedules(out)
    assert records == distinct == trials  # no schedule was measured twice across the four runs
    assert result["runs"] == 3
    # each tuned task's default schedule was measured once, as the baseline its records must beat
    tuned = [t for t in load_tuning(out).tasks if "_conv2d36_" in t.name or "_conv2d40_" in t.name]
    assert len(tuned) == 2 and all(t.default_seconds and t.default_rule == "cpu.Conv2D" for t in tuned)
    # the run that finished checked, inside the model, every record that beat its default alone, at the
    # tuning's thread count and at one thread
    beat_alone = [t for t in tuned if t.best_seconds < t.default_seconds]
    assert all(t.in_model is not None and 1 in {x.threads for x in t.in_model}
               and t.tuned == all(x.tuned < x.default for x in t.in_model) for t in beat_alone), tuned

    # 4. once more: nothing left to do, nothing touched
    before = (out / RECORD_FILE).read_bytes()
    again = json.loads(run_cli(*command, "--json", check=True).stdout)
    assert again["trials_run"] == 0 and again["stopped"] == "nothing to do"
    assert (out / RECORD_FILE).read_bytes() == before

    summary = load_tuning(out)
    # a new host directory: weights layout-free while tuning, timed out of the cache as in the model, NHWC
    assert summary.meta.weight_prepack and summary.meta.cold_weights and summary.meta.channels_last \
        and summary.meta.winograd == 4 and summary.meta.fused_scale
    tuned = [t for t in summary.tasks if t.trials]
    assert sorted(["_conv2d36_" in t.name, "_conv2d40_" in t.name] for t in tuned) == [[False, True], [True, False]]
    assert all(t.best_seconds for t in tuned)
    assert sum(t.share for t in tuned) == pytest.approx(1.0)

    # 5. compiled with the records, the model validates like an untuned one. Whether a record beats edgepack's
    # default schedule on this machine varies from run to run; so that the records are surely applied, both
    # tasks' defaults are made slow (1 s: every record beats it, none is checked in the model)
    from edgepack.tuning.records import DEFAULTS_FILE

    defaults = json.loads((out / DEFAULTS_FILE).read_text())
    for t in tuned:
        defaults[t.workload]["seconds"] = 1.0
        defaults[t.workload].pop("in_model", None)
    (out / DEFAULTS_FILE).write_text(json.dumps(defaults))
    assert load_tuning(out).tuned_tasks == 2
    build = compile_model(model.path, "host", tmp_path / "build", input_shapes=model.input_shapes, tuning=out)
    assert build.manifest.tuning == str(out.resolve())
    assert build.manifest.extra["cpu"]["schedules"].get("tuned") == 2, build.manifest.extra["cpu"]["schedules"]
    untuned = compile_model(model.path, "host", tmp_path / "untuned", input_shapes=model.input_shapes)
    library = build.manifest.artifacts["device_library"]
    assert library.sha256 != untuned.manifest.artifacts["device_library"].sha256  # other kernels
    report = validate(build.output_dir, "host")
    assert report.passed and not report.degenerate, report.to_dict()

    # the build keeps the records it applied (those faster than the default schedules), so the C bundle's
    # static library gets the same kernels
    assert load_tuning(build.output_dir / "tuning").tuned_tasks == load_tuning(out).tuned_tasks == 2
    said: list[str] = []
    bundle = package_c(build.output_dir, tmp_path / "bundle", progress=said.append)
    assert "Applying the build's tuning records" in said
    inputs = {"x": np.random.default_rng(1).standard_normal((1, 3, 48, 192), dtype=np.float32)}
    actual = run_bundle(bundle.output_dir, inputs, emulate=False, static=True).outputs[0]
    expected = run_reference(model.path, "onnx", inputs, bundle.outputs)[0]
    np.testing.assert_allclose(actual, expected, rtol=1e-3, atol=1e-4)

    # the records fit only this model: another one is refused before any build
    with pytest.raises(TuningMismatchError, match="another model"):
        compile_model(models["mobilenetv2"].path, "host", tmp_path / "other", tuning=out)
    assert not (tmp_path / "other").exists()

    # 6. the default time of a task measured for another default schedule than this edgepack's (a release
    # that scheduled the kernel otherwise): its record beat that one, not today's, and is not applied; the
    # compile says so, and the same `tune` command times today's default without any trial left
    from edgepack.frontends import import_model
    from edgepack.profiles import get_profile
    from edgepack.tuning.records import apply_tuning

    host = get_profile("host")
    imported = import_model(model.path, model.input_shapes)
    assert apply_tuning(imported, host, host.tvm_target(), out).stale_tasks == ()
    defaults = json.loads((out / DEFAULTS_FILE).read_text())
    stale = tuned[0]
    defaults[stale.workload].update(schedule="edgepack-cpu/0", seconds=1.0)  # every record beats 1 s
    defaults[stale.workload].pop("in_model", None)
    (out / DEFAULTS_FILE).write_text(json.dumps(defaults))
    position = [t.workload for t in load_tuning(out).tasks].index(stale.workload)
    assert load_tuning(out).tasks[position].tuned  # by the directory's own account
    assert apply_tuning(imported, host, host.tvm_target(), out).stale_tasks == (stale.name,)
    compiled = run_cli("compile", str(model.path), "--input-shape", "x:1,3,48,192", "--profile", "host",
                       "-o", str(tmp_path / "stale"), "--tuning", str(out), check=True)
    said = " ".join((compiled.stdout + compiled.stderr).split())  # steps are shown on stderr
    assert f"keep their default schedule, which this edgepack makes differently than when they were tuned " \
           f"({stale.name})" in said, said
    again = json.loads(run_cli(*command, "--json", check=True).stdout)
    assert again["trials_run"] == 0
    retimed = json.loads((out / DEFAULTS_FILE).read_text())[stale.workload]
    assert retimed["schedule"].startswith("edgepack-cpu/") and retimed["schedule"] != "edgepack-cpu/0"
    assert retimed["seconds"] < 1.0
    assert apply_tuning(imported, host, host.tvm_target(), out).stale_tasks == ()
    assert load_tuning(out).tasks[position].default_seconds == retimed["seconds"]


@pytest.mark.slow
def test_tune_with_a_time_budget(models, tmp_path):
    out = tmp_path / "tuning"
    started = time.monotonic()
    result = json.loads(run_cli("tune", str(models["ppocr_cls"].path), "--input-shape", "x:1,3,48,192", "-o", str(out),
                                "--trials", "10000", "--time-budget", "5s", "--batch", "4", "--json",
                                check=True).stdout)
    assert result["stopped"] == "time" and 0 < result["trials"] < 10000
    assert time.monotonic() - started < 5 + 240  # the batch in flight, plus imports and setup
    assert result["seconds"] >= 5
    # a default schedule is timed in its task's first batch, only for tasks that get trials: timing all
    # 54 tasks' defaults before the first trial ran a 15 s budget for 100 s
    from edgepack.tuning.records import DEFAULTS_FILE

    timed = set(json.loads((out / DEFAULTS_FILE).read_text()))
    assert timed and timed == {t.workload for t in load_tuning(out).tasks if t.trials}, timed
    # the budget is for the directory: a rerun has nothing left
    again = json.loads(run_cli("tune", str(models["ppocr_cls"].path), "-o", str(out), "--trials", "10000",
                               "--time-budget", "5s", "--json", check=True).stdout)
    assert again["stopped"] == "nothing to do" and again["trials"] == result["trials"]


# ---------------------------------------------------------------------------------------------
# real tuning on emulated devices (the farm-in-a-box of scripts/farm.sh)

TRACKER_PORT = 19290  # not the default, nor test_devices' 19190


@pytest.fixture(scope="module")
def farm_inventory(tmp_path_factory):
    """Two emulated rpi4 devices in a private inventory, trusted, behind a running `edgepack farm`."""
    from farm_helpers import farm_info, farm_sh, farm_skip_reason, farm_state_dir

    reason = farm_skip_reason(need_cross_compiler=True)
    if reason:
        pytest.skip(reason)
    was_running = (farm_state_dir() / "farm.json").exists()
    farm_sh("start", "2")
    info = farm_info()
    config = tmp_path_factory.mktemp("config")
    inventory = config / "edgepack" / "devices.toml"
    env = {"XDG_CONFIG_HOME": str(config), "EDGEPACK_INVENTORY": str(inventory)}
    inv = ("--inventory", str(inventory))
    try:
        for d in info["devices"]:
            run_cli("device", "add", d["name"], "--host", d["address"], "--user", d["user"], "--profile", "rpi4",
                    "--key", d["key_path"], "--port", str(d["port"]), *inv, env=env, check=True)
            run_cli("device", "trust", d["name"], "--yes", *inv, env=env, check=True)
        run_cli("farm", "start", "--port", str(TRACKER_PORT), *inv, env=env, check=True)
        yield {"env": env, "inventory": inventory, "devices": [d["name"] for d in info["devices"]]}
    finally:
        run_cli("farm", "stop", *inv, env=env)
        if was_running:
            farm_sh("start", "2", check=False)  # leave someone else's farm as we found it (revived)
        else:
            farm_sh("stop", check=False)


@pytest.mark.slow
def test_tune_on_the_farm_and_a_device_then_compile_and_validate(models, farm_inventory, tmp_path):
    from edgepack.compiling import compile_model
    from edgepack.validation import validate

    env = farm_inventory["env"]
    cls = models["ppocr_cls"]
    out = tmp_path / "tuning"
    common = ("tune", str(cls.path), "--input-shape", "x:1,3,48,192", "--profile", "rpi4", "-o", str(out),
              "--batch", "4", "--task", "_conv2d36_", "--task", "_conv2d40_", "--trials", "8")

    # candidates built here with the aarch64 cross compiler, measured on the devices through the tracker;
    # killed once the first batch is recorded
    proc = subprocess.Popen([sys.executable, "-m", "edgepack", *common, "--on", "farm:rpi4"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, **env), cwd=ROOT)
    _wait_for_records(out, 4, proc, timeout=900)
    proc.kill()
    proc.wait(timeout=60)
    _wait_unlocked(out)
    before = (out / RECORD_FILE).read_bytes()
    first = load_tuning(out)
    assert first.trials == 4
    measured = [t for t in first.tasks if t.trials]
    assert measured and all(t.best_seconds for t in measured)  # real timings from the devices

    # resumed on one device (SSH tunnel to its RPC server): the first records are kept, none redone
    second = json.loads(run_cli(*common, "--json", "--on", farm_inventory["devices"][0], env=env,
                                check=True).stdout)
    assert second["on"] == farm_inventory["devices"][0]
    assert second["trials_before"] == first.trials and second["trials"] == 8
    assert second["trials_run"] == 8 - first.trials
    assert (out / RECORD_FILE).read_bytes().startswith(before)
    assert _distinct_schedules(out) == (8, 8)

    # the records applied (the measured tasks' defaults made slow, so that they surely are, whatever the
    # emulated devices' timings were): other kernels than the untuned build's, still right under qemu
    from edgepack.tuning.records import DEFAULTS_FILE

    defaults = json.loads((out / DEFAULTS_FILE).read_text())
    measured = [t for t in load_tuning(out).tasks if t.trials]
    for t in measured:
        defaults.setdefault(t.workload, {}).update(seconds=1.0)
        defaults[t.workload].pop("in_model", None)
    (out / DEFAULTS_FILE).write_text(json.dumps(defaults))
    assert load_tuning(out).tuned_tasks == len(measured) > 0
    build = compile_model(cls.path, "rpi4", tmp_path / "build", input_shapes=cls.input_shapes, tuning=out)
    assert build.manifest.extra["cpu"]["schedules"].get("tuned", 0) > 0, build.manifest.extra["cpu"]
    untuned = compile_model(cls.path, "rpi4", tmp_path / "untuned", input_shapes=cls.input_shapes)
    assert build.manifest.artifacts["device_library"].sha256 != untuned.manifest.artifacts["device_library"].sha256
    report = validate(build.output_dir, "emulator")
    assert report.passed and not report.degenerate, report.to_dict()


def test_a_dynamic_build_says_which_tuned_kernels_kept_their_default():
    """Records tuned at one size are replayed on a dynamic build's symbolic kernels; where fewer kernels took one
    than were tuned (on GPUs none yet: a tile of shared memory over a run-time extent does not lower), the
    compile says so instead of letting "with tuned kernels (2/55)" stand alone."""
    from edgepack.compiling import _say_unreplayed

    said: list[str] = []
    _say_unreplayed(said.append, 2, 0, {"W": 192})
    assert len(said) == 1 and said[0].startswith("2 of the 2 tuned kernel(s) keep their default schedule")
    assert "tuned at W=192)" in said[0]
    _say_unreplayed(said.append, 2, 2, {"W": 192})
    assert len(said) == 1
