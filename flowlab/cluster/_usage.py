"""What a LocalCluster's processes use, as its panel shows it: CPU and memory per task, and a short
history of each task's activity.

:class:`Usage` is sampled from ``LocalCluster.snapshot()`` (a view calls that every 0.5 s from a
thread): a sample is taken at most every ``every`` seconds, calls in between get the last one, so a
snapshot stays cheap however often it is asked for. CPU is the percent of one core a process used
since the previous sample (user + system time, from ``/proc/<pid>/stat`` on Linux, psutil where it
is importable and there is no ``/proc``), memory its resident bytes (``/proc/<pid>/statm``). Where
neither exists both are None and the history holds messages per second instead (``unit`` says
which). Nothing here starts a thread or sends a message.
"""
from __future__ import annotations

import collections
import os
import threading
import time

__all__ = ["Usage", "read_process"]

HISTORY = 30          # samples kept per task
EVERY = 0.5           # seconds between samples, at least

_PROC = os.path.exists("/proc/self/stat")
try:
    _TICKS = os.sysconf("SC_CLK_TCK") if _PROC else 100
    _PAGE = os.sysconf("SC_PAGE_SIZE") if _PROC else 4096
except (ValueError, OSError, AttributeError):
    _TICKS, _PAGE = 100, 4096


def _psutil():
    if _PROC:
        return None
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def read_process(pid: int) -> tuple[float, int] | None:
    """``(cpu seconds used so far, resident bytes)`` of process ``pid``, or None if it cannot be
    read (gone, another platform without psutil)."""
    if _PROC:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{pid}/statm", "rb") as f:
                statm = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()   # after "pid (comm) ": field 3 on
            cpu = (int(fields[11]) + int(fields[12])) / _TICKS   # utime, stime (fields 14, 15)
            return cpu, int(statm.split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            return None
    psutil = _psutil()
    if psutil is None:
        return None
    try:
        p = psutil.Process(pid)
        t = p.cpu_times()
        return t.user + t.system, p.memory_info().rss
    except Exception:   # noqa: BLE001 - psutil.NoSuchProcess, AccessDenied, ...
        return None


class _Task:
    __slots__ = ("pid", "cpu_s", "msgs", "cpu", "rss", "history")

    def __init__(self):
        self.pid = self.cpu_s = self.msgs = self.cpu = self.rss = None
        self.history = collections.deque(maxlen=HISTORY)


class Usage:
    """Samples of a set of tasks' processes (thread-safe). ``unit``: what ``history`` holds,
    ``"cpu %"`` or ``"msgs/s"`` (where the processes cannot be read)."""

    def __init__(self, every: float = EVERY, keep: int = HISTORY):
        self.every, self.keep = every, keep
        self.unit = "cpu %" if (_PROC or _psutil() is not None) else "msgs/s"
        self._tasks: dict[str, _Task] = {}
        self._last = None        # monotonic time of the last sample
        self._lock = threading.Lock()

    def sample(self, pids: dict, msgs: dict, now: float | None = None) -> dict:
        """``{task: {"cpu", "rss", "history"}}`` for ``pids`` (task -> pid of a process that runs,
        or None: dead, not started) and ``msgs`` (task -> messages to and from it so far). Takes a
        new sample when ``every`` seconds have passed since the last one."""
        now = time.monotonic() if now is None else now
        with self._lock:
            due = self._last is None or now - self._last >= self.every
            if due:
                dt = None if self._last is None else now - self._last
                self._last = now
                for task, pid in pids.items():
                    self._take(task, pid, msgs.get(task, 0), dt)
            out = {}
            for task in pids:
                s = self._tasks.get(task)
                out[task] = ({"cpu": None, "rss": None, "history": []} if s is None else
                             {"cpu": s.cpu, "rss": s.rss, "history": list(s.history)})
            return out

    def _take(self, task, pid, msgs, dt):
        s = self._tasks.get(task)
        first = s is None
        if first:
            s = self._tasks[task] = _Task()
            s.history = collections.deque(maxlen=self.keep)
        got = read_process(pid) if pid else None
        if got is None:
            s.cpu = s.rss = s.cpu_s = None
        else:
            cpu_s, s.rss = got
            same = s.pid == pid and s.cpu_s is not None and dt
            s.cpu = round(max(0.0, (cpu_s - s.cpu_s) / dt * 100.0), 1) if same else None
            s.cpu_s = cpu_s
        s.pid = pid
        rate = None if (s.msgs is None or not dt) else max(0.0, (msgs - s.msgs) / dt)
        s.msgs = msgs
        if not first:      # the first sample has nothing to compare with
            value = s.cpu if self.unit == "cpu %" else rate
            s.history.append(round(float(value or 0.0), 1))
