"""A ``MultiWorkerMirroredStrategy`` group formed from a cluster resolver (``TF_CONFIG``), for plain
processes started by hand, as TensorFlow's multi-worker tutorials start them.

The group's members are the ``chief`` task (if any) then the ``worker`` tasks, in index order;
member ``r`` is rank ``r`` of the collectives (so the chief, else worker 0, is rank 0). This
process serves its own member's address from the spec with a cluster
:class:`~flowlab.cluster.server.Server`, as a TensorFlow worker does, and the collectives run over
a :class:`~flowlab.cluster.collectives.zmq.ZmqCommunicator` between the members' servers (shared
memory between members on one host). Forming the group waits, up to ``connect_timeout`` seconds,
until every member's server answers; after that a :class:`TimeoutError` names the member that
did not, and this process's server is stopped again.

Every message between the members is signed with a cluster key. It comes from
``FLOWLAB_CLUSTER_KEY`` / ``FLOWLAB_CLUSTER_KEY_FILE`` when set. Otherwise, when every member is on
this machine (loopback addresses, the tutorials' ``localhost:12345``), the members share a key
through a file only this user can read, in the per-user 0700 lane directory
(:func:`flowlab.cluster.unix.lane_dir`), named after the members' addresses: the first member to
start writes it, the others read it. A cluster across machines needs ``FLOWLAB_CLUSTER_KEY``.

One group per (members, rank) per process: a second strategy made from the same configuration
reuses the first one's server and communicator.
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time

from ..cluster.spec import ClusterSpec, split_address

__all__ = ["join", "members_of"]

_groups: dict = {}        # (addresses, rank) -> (server, communicator)
_lock = threading.Lock()
_GROUP_JOBS = ("chief", "worker")


def members_of(spec: ClusterSpec) -> list:
    """``[(job, index), ...]``: the chief task(s), then the workers, in index order."""
    return [(job, i) for job in _GROUP_JOBS if job in spec.jobs for i in spec.task_indices(job)]


def _label(job, index) -> str:
    return f"/job:{job}/task:{index}"


def place(spec: ClusterSpec, task_type, task_id, source: str) -> tuple[list, int | None]:
    """``(members, rank)`` of this task; rank None for a task outside the group (an evaluator).
    Raises ValueError, naming ``source`` (where the configuration came from), for what
    MultiWorkerMirroredStrategy cannot run."""
    if "ps" in spec.jobs:
        raise ValueError(f"{source} lists ps tasks: MultiWorkerMirroredStrategy keeps every variable on every worker "
                         f"and has no parameter servers. Use ParameterServerStrategy for ps/worker training, or "
                         f"remove the ps job")
    other = [j for j in spec.jobs if j not in (*_GROUP_JOBS, "evaluator")]
    if other:
        raise ValueError(f"{source} has jobs {other}: MultiWorkerMirroredStrategy runs on 'chief' and 'worker' tasks "
                         f"(and leaves an 'evaluator' alone); rename them 'worker'")
    members = members_of(spec)
    if task_type == "evaluator":
        return members, None
    if task_type is None:
        if len(members) <= 1:
            return members, 0
        raise ValueError(f"{source} lists {len(members)} tasks but does not say which one this process is: add "
                         f'"task": {{"type": "worker", "index": 0}} (1, 2, ... in the other processes)')
    if task_type not in _GROUP_JOBS:
        raise ValueError(f"{source}: task type {task_type!r} cannot run MultiWorkerMirroredStrategy; use 'worker' "
                         f"or 'chief'")
    me = (task_type, 0 if task_id is None else int(task_id))
    if me not in members:
        raise ValueError(f"{source}: this process is {_label(*me)}, which the cluster does not list "
                         f"(it has {[_label(*m) for m in members]})")
    return members, members.index(me)


def join(spec: ClusterSpec, members: list, rank: int, connect_timeout: float, source: str):
    """The communicator of member ``rank`` of ``members`` (see the module docstring)."""
    from ..cluster.collectives.zmq import ZmqCommunicator
    from ..cluster.errors import ClusterError
    from ..cluster.server import Server

    addresses = [spec.task_address(job, i) for job, i in members]
    cache_key = (tuple(addresses), rank)
    with _lock:
        cached = _groups.get(cache_key)
        if cached is not None and not cached[1]._closed:
            return cached[1]
        me = _label(*members[rank])
        key = _group_key(addresses, source)
        host, _ = split_address(addresses[rank])
        try:
            server = Server(ClusterSpec({"worker": addresses}), "worker", rank, key=key,
                            bind="127.0.0.1" if _loopback(host) else host)
        except ClusterError as e:
            raise ClusterError(f"{me} cannot serve its address {addresses[rank]} from {source} ({e}). Is an earlier "
                               f"run still holding the port? End it, or choose free ports in {source}") from None
        try:
            comm = ZmqCommunicator(server, connect_timeout=connect_timeout)
        except TimeoutError as e:
            _stop(server)
            peer = getattr(e, "peer", None)
            who = f"{_label(*members[peer])} at {addresses[peer]}" if peer is not None else "a peer"
            raise TimeoutError(
                f"MultiWorkerMirroredStrategy: {me} waited {connect_timeout:g} s for {who} and never heard from it. "
                f"Start that task too (the same script with its own task in {source}), within the deadline "
                f"(MultiWorkerMirroredStrategy(connect_timeout=...) sets it), and check its address") from None
        except BaseException:
            _stop(server)
            raise
        _groups[cache_key] = (server, comm)
        return comm


def _stop(server, free_within: float = 3.0) -> None:
    """Stop serving this task's address, and wait (briefly) until the port is free again: ZeroMQ
    closes a listening socket in its own I/O thread a moment after ``close`` returns, so a script
    that runs again at once could find its port still taken."""
    server.stop()
    server.join(5.0)
    try:
        host, port = split_address(server.address)
    except Exception:   # noqa: BLE001 - it never listened: nothing to wait for
        return
    deadline = time.monotonic() + free_within
    while True:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # TIME_WAIT connections don't count
            try:
                probe.bind((host, port))
                return
            except OSError:
                if time.monotonic() >= deadline:
                    return
        time.sleep(0.02)


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1", "ip6-localhost") or host.startswith("127.")


def _group_key(addresses, source) -> bytes:
    """The key the members sign their messages with (see the module docstring)."""
    from ..cluster.server import key_from_env, read_key_file
    from ..cluster.unix import lane_dir

    key = key_from_env()
    if key:
        return key
    remote = sorted({a for a in addresses if not _loopback(split_address(a)[0])})
    folder = None if remote else lane_dir(create=True)
    if folder is None:
        why = (f"the cluster in {source} spans machines ({', '.join(remote)})" if remote
               else "this user has no private folder to share a key through")
        raise ValueError(f"{why}: flowlab signs every message between tasks with a cluster key, so set the same "
                         f"FLOWLAB_CLUSTER_KEY in every task's environment (make one with: python -c \"import "
                         f"secrets; print(secrets.token_hex(32))\")")
    digest = hashlib.sha256(json.dumps(list(addresses)).encode()).hexdigest()[:24]
    path = os.path.join(folder, f"group-{digest}.key")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex())
        try:
            os.link(tmp, path)       # atomic: the first member's key wins, complete
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return read_key_file(path)
