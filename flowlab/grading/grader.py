"""``flowlab grade SUBMISSIONS/``: grade a folder of submissions, failing closed.

A submission is a folder (one student; its notebooks) or one notebook file. Each submission is
graded in a process of its own (``python -m flowlab.grading.grader``), up to ``jobs`` at a time;
that process is a child subreaper, so everything the student's code starts (even a daemon that
double-forks) stays its descendant and is ended when the submission is done.

Per notebook: a fresh kernel (jupyter_client; its own process group; stdin closed; ``random``,
numpy and ``fl.random`` seeded by a setup cell), the student's code cells one at a time, each with a
deadline that escalates (interrupt; 3 s later, SIGKILL of the kernel's process group and of every
process it started; a fresh kernel that replays the cells that had succeeded, and the rest go on),
and a deadline for the whole notebook. Then, per exercise of that notebook in the manifest, a probe
cell (:mod:`._probe`) runs every case, visible and hidden, and writes plain results to a file; this
process compares them (:func:`.plain.compare`) with the expected values it computes itself from the
instructor's checks. No file, a missing case, a dead kernel: the exercise fails, with the reason.
Outputs, stderr and tracebacks of the student's cells never count.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ._cells import defined_names as _defined_names, read_cells as _read_cells
from .check import score as _check_score
from ._probe import all_cases
from .manifest import ExerciseError, load_checks, load_manifest
from .plain import compare, to_plain

__all__ = ["grade", "grade_submission", "Grades", "GRACE_S"]

GRACE_S = 3.0              # after an interrupt, how long a cell has to stop before it is killed
SEED = 0
_PR_SET_CHILD_SUBREAPER = 36
_SETUP = f"""\
import random as __fl_random
__fl_random.seed({SEED})
try:
    import numpy as __fl_np
    __fl_np.random.seed({SEED})
    import flowlab as __fl
    __fl.random.set_seed({SEED})
except Exception:
    pass
del __fl_random
"""


# -- processes -------------------------------------------------------------------------------------
def _become_subreaper() -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def _descendants(root: int) -> list:
    """Pids under ``root`` (Linux: read from /proc), deepest last."""
    children: dict = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _sigkill(pids) -> None:
    """SIGKILL each pid; one that is gone already (or not ours to signal) is skipped."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_all_descendants() -> None:
    """SIGKILL every process under this one (it is their subreaper), then reap them."""
    for _ in range(5):
        pids = _descendants(os.getpid())
        if not pids:
            break
        _sigkill(pids)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.02)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break


def _status_text(code) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        try:
            return f"signal {-code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# -- a kernel that can always be ended ---------------------------------------------------------------
class _Outcome:
    def __init__(self, status: str, detail: str = ""):
        self.status, self.detail = status, detail     # ok | error | interrupted | killed | died

    def __repr__(self):
        return f"<{self.status}: {self.detail}>"


class _Kernel:
    """A fresh IPython kernel in its own session (process group) with a blocking client."""

    def __init__(self, cwd: str, env: dict, log, ipc: str):
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

        class ThisPython(KernelSpecManager):
            """ipykernel on the grader's own Python, whatever kernels the machine has installed."""
            def get_kernel_spec(self, kernel_name, *args, **kwargs):
                return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                                  display_name="Python (flowlab grade)", language="python",
                                  interrupt_mode="signal", resource_dir="")

        # IPC sockets (files under ``ipc``): no ports to collide between parallel submissions
        self.km = KernelManager(kernel_name="flowlab-grade", kernel_spec_manager=ThisPython(), transport="ipc",
                                ip=ipc)
        self.km.start_kernel(cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.process = self.km.provisioner.process
        self.pid = self.process.pid
        self.kc = self.km.client()
        self.kc.allow_stdin = False
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=90)
        except Exception:
            self.kill()
            raise

    def alive(self) -> bool:
        return self.process.poll() is None

    def _drain_iopub(self) -> None:
        try:
            while True:
                self.kc.get_iopub_msg(timeout=0)
        except queue.Empty:
            pass
        except Exception:   # noqa: BLE001 - a message we cannot decode is no reason to stop
            pass

    def _wait_reply(self, msg_id: str, seconds: float):
        """The execute reply's content, None at the deadline, or "died"."""
        end = time.monotonic() + seconds
        while True:
            self._drain_iopub()
            left = end - time.monotonic()
            if left <= 0:
                return None
            try:
                msg = self.kc.get_shell_msg(timeout=min(0.1, left))
            except queue.Empty:
                if not self.alive():
                    return "died"
                continue
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                return msg["content"]

    def execute(self, code: str, timeout: float, silent: bool = False) -> _Outcome:
        if not self.alive():
            return _Outcome("died", _status_text(self.process.poll()))
        msg_id = self.kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False,
                                 stop_on_error=False)
        reply = self._wait_reply(msg_id, timeout)
        if reply is None:     # past the deadline: interrupt, then kill
            try:
                self.km.interrupt_kernel()
            except Exception:   # noqa: BLE001 - a kernel that cannot be interrupted is killed below
                pass
            reply = self._wait_reply(msg_id, GRACE_S)
            if reply is None or reply == "died":
                self.kill()
                return _Outcome("killed", f"it ignored the interrupt for {GRACE_S:g} s")
            return _Outcome("interrupted", "stopped by the interrupt")
        if reply == "died":
            time.sleep(0.05)
            return _Outcome("died", _status_text(self.process.poll()))
        if reply.get("status") == "ok":
            return _Outcome("ok")
        return _Outcome("error", f"{reply.get('ename', 'error')}: {str(reply.get('evalue', ''))[:200]}")

    def kill(self) -> None:
        """SIGKILL the kernel's process group and every process under it; wait for the kernel."""
        under = _descendants(self.pid) if self.alive() else []
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _sigkill(under)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        try:
            self.kc.stop_channels()
        except Exception:   # noqa: BLE001
            pass
        try:
            self.km.cleanup_resources()
        except Exception:   # noqa: BLE001
            pass


# -- what each cell defines ------------------------------------------------------------------------
# -- one notebook ----------------------------------------------------------------------------------
class _NotebookRun:
    """Runs one notebook's cells, then probes its exercises; keeps what went wrong, per cell."""

    def __init__(self, path: Path, workdir: Path, probe_dir: Path, env: dict, log, cell_timeout: float,
                 notebook_timeout: float):
        self.path, self.workdir, self.probe_dir, self.env, self.log = path, workdir, probe_dir, env, log
        self.cell_timeout, self.notebook_timeout = float(cell_timeout), float(notebook_timeout)
        self.kernel = None
        self.done: list = []          # sources of the cells that succeeded, in order (replayed)
        self.incidents: list = []     # (cell number or None, text)
        self.cut_at = None            # the first cell the notebook's deadline kept from running
        self.errors: list = []        # (cell number, "ValueError: ...") - for the instructor only
        self.cells: list = []
        self.restarts = 0

    def _fresh_kernel(self) -> bool:
        if self.kernel is not None:
            self.kernel.kill()
        self.kernel = None
        try:
            self.kernel = _Kernel(str(self.workdir), self.env, self.log,
                                  str(self.probe_dir.parent / f"k{self.restarts}-{uuid.uuid4().hex[:6]}"))
        except Exception as e:   # noqa: BLE001
            self.incidents.append((None, f"a kernel could not start: {type(e).__name__}: {e}"))
            return False
        self.kernel.execute(_SETUP, 60, silent=True)
        for source in list(self.done):
            if self.kernel.execute(source, self.cell_timeout).status != "ok":
                self.done.remove(source)
                self.incidents.append((None, "a cell that had run before failed when replayed"))
                if not self.kernel.alive():
                    return self._fresh_kernel() if self.restarts < 20 else False
        return True

    def run_cells(self) -> None:
        try:
            self.cells = _read_cells(self.path)
        except (OSError, ValueError) as e:
            self.incidents.append((None, f"the notebook could not be read ({e})"))
            return
        if not self._fresh_kernel():
            return
        start = time.monotonic()     # the notebook's time: its cells' (and their replays'), not the kernel's start
        for number, source in self.cells:
            left = self.notebook_timeout - (time.monotonic() - start)
            if left <= 0:
                self.incidents.append((number, f"the notebook ran past {self.notebook_timeout:g} s: cell {number} "
                                               f"and those after it were not run"))
                self.cut_at = number
                break
            if not source.strip():
                continue
            limit = min(self.cell_timeout, left)
            what = f"ran past {limit:g} s" if limit == self.cell_timeout else \
                f"was still running when the notebook reached its {self.notebook_timeout:g} s deadline"
            out = self.kernel.execute(source, limit)
            if out.status == "ok":
                self.done.append(source)
            elif out.status == "error":
                self.errors.append((number, out.detail))
            elif out.status == "interrupted":
                self.incidents.append((number, f"cell {number} {what}: interrupted"))
            elif out.status == "killed":
                self.incidents.append((number, f"cell {number} {what}: interrupted, then killed ({out.detail})"))
            elif out.status == "died":
                self.incidents.append((number, f"kernel died in cell {number} ({out.detail})"))
            if out.status in ("killed", "died"):
                self.restarts += 1
                if not self._fresh_kernel():
                    return

    def probe(self, exercise: dict, source_dir: Path, case_timeout: float | None, n_cases: int) -> tuple:
        """``(record or None, reason)``: run the probe cell for ``exercise`` in the kernel."""
        if self.kernel is None or not self.kernel.alive():
            self.restarts += 1
            if not self._fresh_kernel():
                return None, "no result: the probe did not run (no kernel)"
        out_path = self.probe_dir / f"probe-{uuid.uuid4().hex}.json"
        limit = float(case_timeout or 0)
        call = (f'__import__("flowlab.grading._probe", fromlist=["run"]).run({exercise["id"]!r}, '
                f'{exercise["answer"]!r}, {str(out_path)!r}, {str(source_dir)!r}, {limit or None!r})')
        per_case = limit or _case_limit(source_dir, exercise["id"])
        deadline = 20.0 + per_case * max(1, n_cases)
        out = self.kernel.execute(call, deadline, silent=True)
        record, reason = None, ""
        try:
            record = json.loads(out_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            reason = "no result: the probe did not run"
        except (OSError, ValueError) as e:
            reason = f"no result: the probe's file could not be read ({e})"
        if out.status != "ok":      # fail closed: only a probe that returned normally counts
            record = None
            reason = {"killed": f"no result: the checks ran past {deadline:g} s and were killed",
                      "died": f"no result: the kernel died while the checks ran ({out.detail})",
                      "interrupted": f"no result: the checks ran past {deadline:g} s",
                      }.get(out.status, f"no result: the probe failed ({out.detail})")
            if out.status in ("killed", "died"):
                self.restarts += 1
                self._fresh_kernel()
        elif not isinstance(record, dict) or record.get("id") != exercise["id"]:
            record, reason = None, reason or "no result: the probe's file is not this exercise's"
        elif record.get("stuck"):
            self.restarts += 1      # a case still runs in a thread: start clean for the next exercise
            self._fresh_kernel()
        return record, reason

    def close(self) -> None:
        if self.kernel is not None:
            self.kernel.kill()
            self.kernel = None


def _case_limit(source_dir: Path, ex_id: str) -> float:
    from ._probe import DEFAULT_TIME_LIMIT
    try:
        return float(load_checks(source_dir, ex_id).namespace.get("TIME_LIMIT") or DEFAULT_TIME_LIMIT)
    except Exception:   # noqa: BLE001
        return DEFAULT_TIME_LIMIT


# -- scoring ---------------------------------------------------------------------------------------
def _expected(source_dir: Path, ex_id: str):
    """``(checks, [(case, expected plain, tolerance), ...])`` computed here, in the grader."""
    checks = load_checks(source_dir, ex_id)
    out = []
    for case in all_cases(checks):
        out.append((case, to_plain(case.expected_value()), case.tolerance(checks.TOLERANCE)))
    return checks, out


def _score(exercise: dict, checks, expected: list, record, probe_reason: str, context: list) -> dict:
    points = exercise.get("points")
    if points is None:
        points = checks.POINTS if checks is not None and checks.POINTS is not None else 1
    points = float(points)
    cases_out, by_name = [], {}
    if record is not None:
        for rec in record.get("cases") or []:
            if isinstance(rec, dict) and isinstance(rec.get("name"), str):
                by_name.setdefault(rec["name"], rec)
    top = (record or {}).get("error") or probe_reason or ""
    passed = 0
    for case, want, tol in expected:
        rec = by_name.get(case.name)
        if rec is None:
            ok, why = False, top or "no result for this case"
        elif rec.get("error"):
            ok, why = False, str(rec["error"])
        elif not isinstance(rec.get("received"), dict):
            ok, why = False, "no value recorded"
        else:
            ok, why = compare(want, rec["received"], rtol=tol["rtol"], atol=tol["atol"],
                              loose_types=tol["loose_types"])
        passed += ok
        cases_out.append({"name": case.name, "hidden": bool(case.hidden), "passed": bool(ok), "why": why})
    n = len(expected)
    all_or_nothing = bool(exercise.get("all_or_nothing"))
    score = _check_score(points, passed, n, all_or_nothing)      # as the in-place check counts
    status = "pass" if n and passed == n else ("partial" if score > 0 else "fail")
    if status == "pass":
        reason = f"all {n} cases passed"
    elif n == 0:
        reason = top or "the instructor's checks have no cases"
    elif passed == 0 and top:
        reason = top
    elif passed == 0 and len({c["why"] for c in cases_out}) == 1:
        reason = f"all {n} cases failed: {cases_out[0]['why']}"
    else:
        failed = [c for c in cases_out if not c["passed"]]
        first = failed[0]
        label = f"hidden case '{first['name']}'" if first["hidden"] else f"case '{first['name']}'"
        reason = f"{len(failed)} of {n} cases failed; {label}: {first['why']}"
    if status != "pass" and context:
        reason += " [" + "; ".join(context) + "]"
    return {"exercise": exercise["id"], "title": exercise.get("title") or exercise["id"], "points": score,
            "max": points, "status": status, "reason": reason, "cases": cases_out,
            "all_or_nothing": all_or_nothing}


def _failed(exercise: dict, reason: str, source_dir: Path) -> dict:
    try:
        checks, expected = _expected(source_dir, exercise["id"])
    except Exception:   # noqa: BLE001
        checks, expected = None, []
    row = _score(exercise, checks, expected, None, reason, [])
    row.update(status="fail", points=0.0, reason=reason)
    return row


# -- one submission (in its own process) -------------------------------------------------------------
def _notebooks_of(submission: Path) -> list:
    if submission.is_file():
        return [submission]
    return sorted(p for p in submission.rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts and not any(part.startswith(".") for part in
                                                                       p.relative_to(submission).parts))


def _match(notebooks: list, name: str, single: bool):
    """The submitted notebook for the manifest's ``name``: same file name, else one whose name
    starts with its stem (``09_ring_allreduce-Copy1.ipynb``), else (a one-notebook submission) it."""
    for nb in notebooks:
        if nb.name == name:
            return nb
    stem = Path(name).stem
    for nb in notebooks:
        if nb.stem.startswith(stem):
            return nb
    return notebooks[0] if single and len(notebooks) == 1 else None


def _kernel_env(source_dir: Path, home: Path) -> dict:
    import flowlab
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLOWLAB_CLUSTER_KEY", "JPY_", "PYTEST_", "COV_"))}
    root = str(Path(flowlab.__file__).resolve().parent.parent)
    env.update(PYTHONHASHSEED=str(SEED), FLOWLAB_SEED=str(SEED), FLOWLAB_EXERCISES=str(source_dir), FLOWLAB_GRADER="1",
               MPLBACKEND="agg", IPYTHONDIR=str(home / "ipython"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.setdefault("FLOWLAB_BLAS_THREADS", "1")
    return env


def grade_submission(submission, source_dir, cell_timeout: float = 30, notebook_timeout: float = 600,
                     case_timeout: float | None = None, log=None, only: str | None = None) -> dict:
    """Grade one submission (a folder or a notebook) here: ``{"student", "rows": [...], "notebooks":
    {...}, "seconds"}``; ``only``: just that exercise id (and its notebook). Meant for the process
    :func:`grade` starts for it (this makes that process a subreaper and ends everything under it)."""
    t0 = time.monotonic()
    submission, source_dir = Path(submission).resolve(), Path(source_dir).resolve()
    student = submission.stem if submission.is_file() else submission.name
    manifest = load_manifest(source_dir)
    notebooks = _notebooks_of(submission)
    by_notebook: dict = {}
    if only is not None and only not in manifest:
        raise ExerciseError(f"no exercise {only!r} in {source_dir / 'manifest.json'}")
    for ex in manifest.values():
        if only is None or ex["id"] == only:
            by_notebook.setdefault(ex["notebook"], []).append(ex)
    single = submission.is_file()
    rows, notes = [], {}
    log = log or sys.stderr
    with tempfile.TemporaryDirectory(prefix="flowlab-grade-") as tmp:
        tmp = Path(tmp)
        work = tmp / "work"
        if submission.is_dir():
            shutil.copytree(submission, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        else:
            work.mkdir()
            shutil.copy2(submission, work / submission.name)
        probe_dir = tmp / "probe"
        probe_dir.mkdir()
        env = _kernel_env(source_dir, tmp)
        for nb_name, exercises in by_notebook.items():
            found = _match(notebooks, nb_name, single)
            if found is None:
                for ex in exercises:
                    rows.append(_failed(ex, f"no notebook {nb_name} in the submission", source_dir))
                continue
            rel = found.relative_to(submission) if submission.is_dir() else Path(found.name)
            run = _NotebookRun(work / rel, (work / rel).parent, probe_dir, env, log, cell_timeout, notebook_timeout)
            try:
                run.run_cells()
                for ex in exercises:
                    try:
                        checks, expected = _expected(source_dir, ex["id"])
                    except Exception as e:   # noqa: BLE001 - the instructor's checks: say so, fail closed
                        rows.append(_failed(ex, f"the instructor's checks could not run: {type(e).__name__}: {e}",
                                            source_dir))
                        continue
                    record, reason = run.probe(ex, source_dir, case_timeout, len(expected))
                    name = ex["answer"].split(".")[0]
                    defining = [k for k, src in run.cells if name in _defined_names(src)]
                    # what went wrong in the cells that define the answer; if none does, all of it
                    context = [text for cell, text in run.incidents
                               if not defining or cell is None or cell in defining
                               or (cell == run.cut_at and max(defining) >= cell)]
                    if not defining:    # no cell defines it: the cells that raised may be why
                        context += [f"cell {cell} raised {error}" for cell, error in run.errors[:3]]
                    row = _score(ex, checks, expected, record, reason, context)
                    if len(defining) > 1:
                        row["note"] = (f"'{name}' is defined in cells {', '.join(map(str, defining))}: "
                                       f"the last one counts")
                    rows.append(row)
            finally:
                run.close()
            notes[str(rel)] = {"incidents": [{"cell": c, "what": t} for c, t in run.incidents],
                               "errors": [{"cell": c, "error": t} for c, t in run.errors],
                               "kernel_restarts": run.restarts}
    _kill_all_descendants()
    return {"student": student, "rows": rows, "notebooks": notes, "seconds": round(time.monotonic() - t0, 2)}


def _child_main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flowlab.grading.grader")
    p.add_argument("submission")
    p.add_argument("--source", required=True)
    p.add_argument("--result", required=True)
    p.add_argument("--cell-timeout", type=float, default=30)
    p.add_argument("--notebook-timeout", type=float, default=600)
    p.add_argument("--case-timeout", type=float, default=None)
    p.add_argument("--only", default=None, help="grade just this exercise id")
    a = p.parse_args(argv)
    _become_subreaper()

    def on_term(signum, frame):
        _kill_all_descendants()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        result = grade_submission(a.submission, a.source, a.cell_timeout, a.notebook_timeout, a.case_timeout,
                                  only=a.only)
    finally:
        _kill_all_descendants()
    tmp = a.result + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, a.result)
    return 0


# -- many submissions ------------------------------------------------------------------------------
def _submissions(path: Path) -> list:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ExerciseError(f"no submissions at {path}")
    return sorted(p for p in path.iterdir()
                  if not p.name.startswith((".", "_")) and (p.is_dir() or p.suffix == ".ipynb"))


class Grades:
    """What :func:`grade` made: ``rows`` (one dict per student and exercise), ``students``, the
    ``summary`` table, and the ``out`` folder the reports are in."""

    def __init__(self, rows, students, summary, out):
        self.rows, self.students, self.summary, self.out = rows, students, summary, out

    def row(self, student: str, exercise: str) -> dict:
        for r in self.rows:
            if r["student"] == student and r["exercise"] == exercise:
                return r
        raise KeyError(f"no grade for student {student!r}, exercise {exercise!r}")

    def __repr__(self):
        return self.summary


def grade(submissions_dir, source_dir="exercises", out_dir="grades", jobs: int | None = None,
          cell_timeout: float = 30, notebook_timeout: float = 600, case_timeout: float | None = None,
          echo: bool = True) -> Grades:
    """Grade every submission in ``submissions_dir`` (folders or notebooks) against the instructor's
    ``source_dir``, ``jobs`` at a time (default: the core count); write ``grades.csv``,
    ``grades.json`` and ``<student>/results.json`` (Gradescope) into ``out_dir``; print (``echo``)
    and return the summary."""
    from .reports import write_reports
    source = Path(source_dir).resolve()
    manifest = load_manifest(source)
    subs = _submissions(Path(submissions_dir).resolve())
    names = [s.stem if s.is_file() else s.name for s in subs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ExerciseError(f"two submissions would have the same student name: {', '.join(sorted(dup))}")
    out = Path(out_dir).resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    jobs = max(1, int(jobs or os.cpu_count() or 1))
    n_books = len({ex["notebook"] for ex in manifest.values()})
    backstop = n_books * (notebook_timeout + 120) + 300 * len(manifest) + 120   # only if its process hangs
    results, running, todo = {}, {}, list(zip(names, subs))
    with tempfile.TemporaryDirectory(prefix="flowlab-grades-") as tmp:
        while todo or running:
            while todo and len(running) < jobs:
                name, sub = todo.pop(0)
                result = Path(tmp) / f"{uuid.uuid4().hex}.json"
                cmd = [sys.executable, "-m", "flowlab.grading.grader", str(sub), "--source", str(source),
                       "--result", str(result), "--cell-timeout", str(cell_timeout),
                       "--notebook-timeout", str(notebook_timeout)]
                if case_timeout:
                    cmd += ["--case-timeout", str(case_timeout)]
                log = open(logs / f"{_safe(name)}.log", "w")
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                running[name] = (proc, result, log, time.monotonic())
            time.sleep(0.05)
            for name, (proc, result, log, started) in list(running.items()):
                code = proc.poll()
                if code is None and time.monotonic() - started > backstop:
                    _end(proc)
                    code = proc.returncode
                    why = f"the grader gave up on this submission after {backstop:g} s"
                elif code is None:
                    continue
                else:
                    why = f"the grader's process for this submission failed ({_status_text(code)})"
                log.close()
                del running[name]
                try:
                    results[name] = json.loads(result.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    tail = (logs / f"{_safe(name)}.log").read_text(errors="replace").strip().splitlines()[-1:]
                    results[name] = {"student": name, "seconds": None, "notebooks": {}, "rows": [
                        {"exercise": ex["id"], "title": ex.get("title") or ex["id"], "points": 0.0,
                         "max": float(ex["points"] if ex.get("points") is not None else 1), "status": "fail",
                         "reason": why + (f": {tail[0]}" if tail else ""), "cases": []}
                        for ex in manifest.values()]}
    ordered = [results[n] for n in names]
    rows, summary = write_reports(out, ordered, list(manifest.values()))
    if echo:
        print(summary)
    return Grades(rows, ordered, summary, out)


def _end(proc) -> None:
    """SIGTERM a submission's grading process (it ends what is under it), SIGKILL after 10 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _safe(name: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return keep.lstrip(".") or "student"


if __name__ == "__main__":
    sys.exit(_child_main())
