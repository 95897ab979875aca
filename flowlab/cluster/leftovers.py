"""What flowlab processes leave on this host, named after their owner, and the sweep that removes
what dead owners left.

Three kinds of file outlive a process that is killed (SIGKILL runs no exit handler):

- shared-memory segments in ``/dev/shm`` (the collectives' rings and windows, :mod:`.collectives.shm`
  and :mod:`.collectives.direct`): ``flowlab-<owner>-r<random>`` and ``flowlab-<owner>-w<random>``;
- a LocalCluster's temporary folder, which holds the tasks' logs: ``<tmp>/flowlab-cluster-<owner>-<random>``;
- local-lane sockets (:mod:`.unix`), named after the address they serve, not after an owner.

The *owner tag* is ``<pid>-<start>-<pidns>``: the process id, its start time (clock ticks since
boot, field 22 of ``/proc/<pid>/stat``) and its pid namespace. A pid is soon reused; a pid with
the same start time is not. An owner counts as gone when no process has that pid and start time,
or when it is a zombie; an owner in another pid namespace (a container sharing ``/dev/shm`` or
``/tmp``) is never judged: what it made is left alone. A lane socket counts as dead when no
socket of this network namespace is bound to it (``/proc/net/unix``; elsewhere: nothing accepts a
connection), and it was made a while ago.

Every exit path, then: a cluster's ``close``, its garbage collection and interpreter exit remove
its folder and lanes (:mod:`.local`); segments this process made and has not unlinked yet are
registered here (:func:`own`) and unlinked by :func:`release_owned`, which runs at exit and on a
worker's own fast exits (:mod:`.worker`); what a killed process left is removed by :func:`sweep`,
which every LocalCluster worker runs once, in the background, after it starts, and which the
collectives run on the segments when a process first makes one.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import stat
import tempfile
import threading
import time

__all__ = ["owner_tag", "owner_gone", "own", "disown", "release_owned", "sweep", "sweep_segments",
           "sweep_folders", "sweep_lanes", "SHM_DIR", "FOLDER_PREFIX"]

SHM_DIR = "/dev/shm"
FOLDER_PREFIX = "flowlab-cluster-"
LANE_MIN_AGE_S = 0.5        # a lane socket made this little before the look at /proc/net/unix is not judged
LANE_MIN_AGE_NO_PROC_S = 60.0   # without /proc/net/unix: a socket that refuses is judged after this long
OLD_NAME_MIN_AGE_S = 60.0   # segments named before owner tags (pid only) are judged after this long
_TAGGED = re.compile(r"(\d+)-(\d+)-(\d+)-")          # pid, start, pid namespace
_PID_ONLY = re.compile(r"(\d+)-w?[0-9a-f]+$")      # flowlab-<pid>-<hex>: the older segment names
_owned: set = set()
_owned_lock = threading.Lock()
_atexit_done = False
_tag = None


def _stat_fields(pid) -> list | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the 3rd field first), or None
    when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return []
    return raw[raw.rindex(b")") + 2:].split()


def _pid_ns() -> str:
    try:
        link = os.readlink("/proc/self/ns/pid")       # pid:[4026531836]
        return "".join(c for c in link if c.isdigit()) or "0"
    except OSError:
        return "0"


def owner_tag() -> str:
    """This process's owner tag, ``<pid>-<start>-<pidns>`` (see the module docstring)."""
    global _tag
    pid = os.getpid()
    if _tag is None or not _tag.startswith(f"{pid}-"):     # a forked child gets its own
        fields = _stat_fields("self") or []
        start = fields[19].decode() if len(fields) > 19 else "0"
        _tag = f"{pid}-{start}-{_pid_ns()}"
    return _tag


def owner_gone(pid: int, start: str | None = None, ns: str | None = None) -> bool:
    """Whether the owner ``pid`` (with its start time and pid namespace, when known) is gone for
    sure. An owner of another pid namespace is never gone: this process cannot see it."""
    if ns is not None and ns != _pid_ns():
        return False
    if pid <= 0:
        return False
    fields = _stat_fields(pid)
    if fields is None:
        try:                          # no /proc entry: is there /proc at all?
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return not os.path.isdir("/proc/self")
    if not fields:
        return False
    if fields[0] in (b"Z", b"X"):
        return True
    return start is not None and start != "0" and len(fields) > 19 and fields[19].decode() != start


# -- what this process made --------------------------------------------------------------------------
def own(path: str) -> None:
    """Remember that this process made ``path`` (a shared segment) and must unlink it before it ends."""
    global _atexit_done
    with _owned_lock:
        _owned.add(path)
        if not _atexit_done:
            _atexit_done = True
            atexit.register(release_owned)


def disown(path: str) -> None:
    """``path`` was unlinked (or handed on): nothing to do for it at exit."""
    _owned.discard(path)


def release_owned() -> int:
    """Unlink every segment this process made and still has linked; how many there were. Runs at
    interpreter exit, and on a worker's fast exits (``os._exit`` skips exit handlers)."""
    with _owned_lock:
        paths = list(_owned)
        _owned.clear()
    n = 0
    for path in paths:
        try:
            os.unlink(path)
            n += 1
        except OSError:
            pass
    return n


# -- what dead processes left -------------------------------------------------------------------------
def _tag_gone(text: str) -> bool | None:
    """For ``<pid>-<start>-<ns>-...``: whether that owner is gone; None when ``text`` has no tag."""
    m = _TAGGED.match(text)
    if m is None:
        return None
    return owner_gone(int(m.group(1)), m.group(2), m.group(3))


def sweep_segments(directory: str = SHM_DIR) -> list:
    """Unlink the flowlab segments in ``directory`` whose owner is gone; the names removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    uid, now = os.getuid(), time.time()
    for name in names:
        if not name.startswith("flowlab-"):
            continue
        rest = name[len("flowlab-"):]
        path = os.path.join(directory, name)
        gone = _tag_gone(rest)
        if gone is None:
            m = _PID_ONLY.match(rest)
            if m is None:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            gone = now - st.st_mtime > OLD_NAME_MIN_AGE_S and owner_gone(int(m.group(1)))
        if gone and _mine(path, uid):
            try:
                os.unlink(path)
                removed.append(name)
            except OSError:
                pass
    return removed


def _mine(path, uid) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return st.st_uid == uid and not stat.S_ISLNK(st.st_mode)


def folder_prefix() -> str:
    """The prefix of this process's LocalCluster folders (``tempfile.mkdtemp(prefix=...)``)."""
    return f"{FOLDER_PREFIX}{owner_tag()}-"


def sweep_folders(directory: str | None = None) -> list:
    """Remove the LocalCluster folders in ``directory`` (the temporary directory) whose owner is
    gone; the names removed. Folders named before owner tags are left alone."""
    directory = directory or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    uid = os.getuid()
    for name in names:
        if name.startswith(FOLDER_PREFIX) and _tag_gone(name[len(FOLDER_PREFIX):]):
            path = os.path.join(directory, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
    return removed


def _bound_unix_paths() -> set | None:
    """Paths that sockets of this network namespace are bound to, or None without /proc/net/unix."""
    try:
        with open("/proc/net/unix", "rb") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    paths = set()
    for line in lines:
        parts = line.split(None, 7)
        if len(parts) == 8 and parts[7].startswith(b"/"):
            paths.add(os.fsdecode(parts[7]))
    return paths


def sweep_lanes(directory: str | None = None) -> list:
    """Remove the lane sockets of this network namespace in the lane directory that no socket is
    bound to any more (their task was killed); the names removed."""
    from . import unix

    directory = directory or unix.lane_dir()
    removed = []
    if not directory:
        return removed
    seen = time.time()
    bound = _bound_unix_paths()         # read before the listing: a socket bound after it is young
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    prefix = f"{unix._NETNS}-"
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".sock")):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode) or seen - st.st_mtime < LANE_MIN_AGE_S:
            continue
        if bound is not None:
            dead = path not in bound
        else:     # a listener between its bind and its listen refuses too: only old files
            dead = seen - st.st_mtime > LANE_MIN_AGE_NO_PROC_S and unix.refuses(path)
        if not dead:
            continue
        try:
            if os.lstat(path).st_ino == st.st_ino:     # not replaced by a new listener meanwhile
                os.unlink(path)
                removed.append(name)
        except OSError:
            pass
    return removed


def sweep() -> dict:
    """Remove what dead flowlab processes of this user left on this host: shared segments, cluster
    folders, lane sockets. Never touches what a live process owns. Returns the names removed."""
    return {"segments": sweep_segments(), "folders": sweep_folders(), "lanes": sweep_lanes()}
