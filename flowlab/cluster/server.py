"""``Server``: one task's message loop, as TensorFlow's ``tf.distribute.Server``.

A server listens on its task's address, checks every message (:mod:`.protocol`), and dispatches it
by ``type`` to a handler. A handler is ``fn(server, msg)`` returning None, a dict (the reply's
body) or a :class:`Reply` (body and buffers); if it raises, the client gets a RemoteError with the
traceback. Handlers are registered per message type, for every server with :func:`handler` or for
one with :meth:`Server.register`:

- *inline* handlers run on the loop thread, between messages: quick ones (ping, put, get, events,
  tensor ops that do not wait);
- the others run one at a time on the server's execution thread, so the loop keeps receiving
  while they work or wait (user code from ``run``, a ``push`` to another task, later a ``recv``);
- a handler whose ``inline`` is a function ``inline(server, msg) -> bool`` runs on the loop thread
  when that says the message is quick (a tiny eager op) and the execution thread has nothing
  queued or running (so messages of one client never overtake each other), else on the exec thread.

Built-in types: ``hello``, ``ping``, ``spec``, ``run``, ``put``, ``get``, ``delete``, ``push``,
``events``, ``stats``, ``shutdown``, ``cancel``, ``fault`` (injected faults, :mod:`.faults`),
``coll-sync`` (the task's collective state, which a client brings back in step after it stopped a
call on several tasks), ``task-gone`` (one-way: the liveness monitor's notice that another task of
the job died, read by the collectives, :mod:`.collectives._gone`).

``cancel`` (inline) stops a request of the same client on the exec thread: one still queued is
answered with a KeyboardInterrupt error and never runs; the one running gets a KeyboardInterrupt
raised in it. In a LocalCluster worker the exec jobs run on the process's main thread
(:meth:`Server.serve_exec`), so the interrupt is a real SIGINT to that thread and stops
``time.sleep`` and other waits in C that return on a signal; elsewhere it is raised
asynchronously in the exec thread, which Python checks between bytecodes only. Reply bodies carry ``re`` (the request's seq) and ``ok``;
handlers must not use those keys. Messages that fail a check are dropped, logged (logger
``flowlab.cluster``) and counted in ``stats``; the server keeps serving.

Code running on a task finds its place with :func:`rank`, :func:`world_size` and
:func:`current_server`.
"""
from __future__ import annotations

import logging
import os
import queue
import signal as _signal
import sys
import threading
import traceback
from collections.abc import Mapping

from . import events as _events
from . import schemes as _schemes
from .errors import ClusterError, ProtocolError
from .protocol import Pickled, Signer, Verifier, dumps, loads, new_id, new_key
from .spec import ClusterSpec, parse_task, task_name

__all__ = ["Server", "Reply", "Store", "handler", "rank", "world_size", "current_server", "key_from_env"]

log = logging.getLogger("flowlab.cluster")
_CANCEL_RETRY_S = 0.05     # a cancel that arrived during an import or a ring copy asks again this much later
_IMPORT_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")


def _uncuttable(frame) -> bool:
    """Whether ``frame`` (where a signal interrupted the exec thread) is inside an import, or in
    code that moves data through a shared-memory ring (``shm.NO_INTERRUPT``): cut there, either
    would stay broken for every later call."""
    shm = sys.modules.get("flowlab.cluster.collectives.shm")
    rings = getattr(shm, "NO_INTERRUPT", ())      # () while shm itself is being imported
    while frame is not None:
        code = frame.f_code
        if code.co_filename in _IMPORT_FILES or code in rings:
            return True
        frame = frame.f_back
    return False


_LOOPBACK = ("127.0.0.1", "localhost", "::1", "inproc")


class Reply:
    """A handler's answer with buffers: ``Reply({"n": 3}, [array])``."""
    __slots__ = ("body", "buffers")

    def __init__(self, body=None, buffers=()):
        self.body, self.buffers = body or {}, buffers


_HANDLERS: dict[str, tuple] = {}


def handler(type: str, inline: bool = True, reply: bool = True):
    """Register ``fn(server, msg)`` for message ``type`` on every server (a decorator); see
    :meth:`Server.register` for ``inline`` and ``reply``."""
    def register(fn):
        _HANDLERS[type] = (fn, inline, reply)
        return fn
    return register


class Store:
    """A task's named values (what ``put`` delivered, what ops produced), with waiting: ``wait``
    returns a value as soon as another thread or message puts it."""

    def __init__(self):
        self._values: dict = {}
        self._cond = threading.Condition()

    def put(self, key, value) -> None:
        with self._cond:
            self._values[key] = value
            self._cond.notify_all()

    def get(self, key):
        try:
            return self._values[key]
        except KeyError:
            raise KeyError(f"no value named {key!r} on this task (it has {sorted(self._values)[:20]})") from None

    def wait(self, key, timeout: float):
        with self._cond:
            if not self._cond.wait_for(lambda: key in self._values, timeout):
                raise TimeoutError(f"no value named {key!r} arrived within {timeout} s")
            return self._values[key]

    def pop(self, key, default=None):
        with self._cond:
            return self._values.pop(key, default)

    def keys(self):
        return list(self._values)

    def __contains__(self, key):
        return key in self._values

    def __len__(self):
        return len(self._values)


def key_from_env(environ=None) -> bytes | None:
    """The cluster key from ``FLOWLAB_CLUSTER_KEY`` (hex) or the file named by
    ``FLOWLAB_CLUSTER_KEY_FILE`` (hex text or raw bytes); None when neither is set."""
    env = os.environ if environ is None else environ
    if env.get("FLOWLAB_CLUSTER_KEY"):
        return bytes.fromhex(env["FLOWLAB_CLUSTER_KEY"].strip())
    if env.get("FLOWLAB_CLUSTER_KEY_FILE"):
        return read_key_file(env["FLOWLAB_CLUSTER_KEY_FILE"])
    return None


def read_key_file(path) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    try:
        return bytes.fromhex(data.decode().strip())
    except (UnicodeDecodeError, ValueError):
        return data


class Server:
    """One task of a cluster: ``Server(spec, job_name, task_index)`` listens on the task's port
    and serves messages on a background thread (``start=True``, as in TensorFlow).

    - ``key``: the cluster key (bytes, >= 16). None: ``FLOWLAB_CLUSTER_KEY`` /
      ``FLOWLAB_CLUSTER_KEY_FILE``, else a new random key (see ``server.key``).
    - ``bind``: the address to listen on; 127.0.0.1 unless given. A non-loopback address is
      reachable from other machines: flowlab warns, and only the key protects the server then.
    - ``port``: overrides the spec's port (0: any free port; ``port_tries`` > 1 skips ports in use).
    - ``transport``: a scheme of :mod:`.schemes` (``"tcp"``, also called ``"zmq"``, or
      ``"inproc"``) or a transport object; by default the one the scheme of this task's address
      in the spec names (``inproc:3``: in-process), else TCP.

    ``protocol`` and ``config`` are accepted where TensorFlow has them; ``protocol`` is only a
    label (the transport decides), ``config`` is unused.
    """

    def __init__(self, server_or_cluster_def=None, job_name=None, task_index=None, protocol=None,
                 config=None, start=True, *, key=None, bind=None, port=None, port_tries=1,
                 transport=None, event_log=None):
        spec = server_or_cluster_def
        if spec is not None and not isinstance(spec, ClusterSpec):
            spec = ClusterSpec(spec)
        if job_name is None:
            jobs = spec.jobs if spec else []
            if len(jobs) > 1:
                raise ValueError(f"this cluster has jobs {jobs}: say which one with job_name=")
            job_name = jobs[0] if jobs else "worker"
        self.spec = spec
        self.job_name = job_name
        self.task_index = int(task_index or 0)
        self.name = task_name(job_name, self.task_index)
        if port is None:
            if not spec:
                raise ValueError("a Server needs a ClusterSpec that lists its task, or port= (0: any free port)")
            port = int(spec.task_address(job_name, self.task_index).rpartition(":")[2])
        self._port, self._port_tries = port, port_tries
        self.key = key if key is not None else (key_from_env() or new_key())
        self.bind = bind or "127.0.0.1"
        if self.bind not in _LOOPBACK and not self.bind.startswith("127."):
            import warnings
            warnings.warn(f"{self.name} listens on {self.bind}, reachable from other machines; only the "
                          f"cluster key protects it", stacklevel=2)
        self.transport = _schemes.resolve(transport, self.key, _listed_address(spec, job_name, self.task_index))
        self.protocol = protocol or self.transport.name
        self.id = new_id("server")
        self.pid = os.getpid()
        self.store = Store()
        self.log = event_log if event_log is not None else _events.default_log()
        self.stats = {"messages": 0, "dropped": 0, "bytes_in": 0}
        self._handlers = dict(_HANDLERS)
        self._signer = Signer(self.key, self.id)
        self._verifier = Verifier(self.key, self.id)
        self._listener = None
        self._thread = None
        self._exec_thread = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._queued = self._finished = 0   # exec jobs handed over / done (one writer each, no lock)
        self._waiting: set = set()    # (sender, seq) of exec jobs queued and not started
        self._cancelled: set = set()  # ... of those, the ones a ``cancel`` asked to skip
        self._running = None          # (sender, seq) of the exec job running now
        self._cancel_key = None       # the running job a ``cancel`` asked to stop
        self._stopping = False
        self._done = threading.Event()
        self._peers = None          # a Client to other tasks, made on first use
        self._faults = None         # injected faults (faults.Faults), set by a ``fault`` message
        self._code_cache: dict = {}
        self._state: dict = {}      # name -> what another module keeps for this task (see state)
        if start:
            self.start()

    @staticmethod
    def create_local_server(config=None, start: bool = True, **kwargs) -> "Server":
        """A one-task server on a free 127.0.0.1 port (``/job:localhost/task:0``), as TensorFlow's."""
        return Server(None, "localhost", 0, config=config, start=start, port=0, **kwargs)

    # -- lifecycle ------------------------------------------------------------------------------
    def listen(self) -> str:
        """Bind the listening socket now (``start`` does it too); returns ``host:port``."""
        if self._listener is None:
            self._listener = self.transport.listen(self.bind, self._port, self._port_tries)
            if hasattr(self._listener, "check_with"):    # headers checked before buffers are received
                self._listener.check_with(self._verifier.admit)
        return self.address

    def start(self) -> None:
        """Serve on a background thread (idempotent)."""
        self.listen()
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve, name=f"flowlab-server{self.name}", daemon=True)
            self._thread.start()

    def serve(self) -> None:
        """Run the message loop in this thread until ``stop()`` or a ``shutdown`` message."""
        self.listen()
        _local.server = self
        try:
            self._loop()
        finally:
            self._stopping = True
            self._jobs.put(None)
            if self._peers is not None:
                self._peers.close()
            self._listener.close()
            self._done.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the server stops (forever by default, as TensorFlow's ``join``); True if it did."""
        return self._done.wait(timeout)

    def stop(self) -> None:
        """Stop serving: the loop ends at once (within half a second at worst) and the socket closes."""
        self._stopping = True
        if self._listener is None or self._done.is_set():
            return
        if self._thread is None:
            self._listener.close()
            self._done.set()
        else:
            self._listener.wake()

    @property
    def address(self) -> str:
        if self._listener is None:
            raise ClusterError(f"{self.name} is not listening yet: call start()")
        return self._listener.address

    @property
    def target(self) -> str:
        """``flowlab://host:port``: what a client or a Session connects to."""
        return f"flowlab://{self.address}"

    def register(self, type: str, fn, inline: bool = True, reply: bool = True) -> None:
        """Handle messages of ``type`` on this server with ``fn(server, msg)``: in the loop's own
        thread when ``inline``, else on the server's exec thread (``inline`` may be a function
        ``inline(server, msg) -> bool``: see the module's docstring). With ``reply=False`` the messages
        are one-way (always handled in the loop's thread): nothing is sent back, not even an error, which is logged and counted in
        ``stats["oneway_errors"]`` instead (for streams whose sender never waits for an answer)."""
        self._handlers[type] = (fn, inline, reply)

    def peers(self):
        """A Client to the other tasks of this server's cluster (for pushes between tasks)."""
        if self._peers is None:
            from .client import Client
            self._peers = Client(self.key, transport=self.transport, name=f"peer{self.name}")
        return self._peers

    def state(self, name: str, factory=dict):
        """The per-task state that module ``name`` keeps on this server (its full module name, e.g.
        ``"flowlab.cluster.collectives._gone"``), made by ``factory()`` on its first use and kept
        while the server lives. This is the one place other modules keep state per task: they
        never set attributes on a Server."""
        got = self._state.get(name)
        if got is None:
            got = self._state.setdefault(name, factory())
        return got

    @property
    def faults(self):
        """The faults injected into this task (a :class:`~.faults.Faults`), None when none is set
        (``cluster.delay/drop/corrupt`` set them through :func:`.faults.control`)."""
        return self._faults

    @faults.setter
    def faults(self, value) -> None:
        self._faults = value

    @property
    def lane(self) -> str | None:
        """How clients may reach this server: ``"unix+tcp"`` (the local lane beside TCP, see
        :mod:`.unix`), ``"tcp"`` or ``"inproc"``; None before it listens."""
        return getattr(self._listener, "lane", None) if self._listener else None

    def __repr__(self):
        where = f"{self._listener.address} ({self.lane})" if self._listener else "not listening"
        return f"<flowlab Server {self.name} at {where}>"

    # -- the loop --------------------------------------------------------------------------------
    def _loop(self):
        listener, unpack, handlers, stats = self._listener, self._verifier.unpack, self._handlers, self.stats
        jobs = self._jobs
        while not self._stopping:
            item = listener.recv(0.5)
            if item is None:
                continue
            peer, frames = item
            try:
                msg = unpack(frames)
            except ProtocolError as e:
                self._drop(e, frames)
                continue
            if self._faults is not None and msg.type != "fault" and not self._fault_in(msg, frames):
                continue
            stats["messages"] += 1
            if msg.nbytes:
                stats["bytes_in"] += msg.nbytes
            entry = handlers.get(msg.type)
            if entry is None:
                self._answer(peer, msg, None, listener.send,
                             error=ClusterError(f"{self.name} has no handler for messages of type {msg.type!r} "
                                                f"(it has {sorted(handlers)})"))
            elif not entry[2]:
                self._oneway(msg, entry[0])
            elif entry[1] is True or (entry[1] is not False and self._inline(entry[1], msg)):
                self._answer(peer, msg, entry[0], listener.send)
            else:
                self._start_exec()
                self._queued += 1
                self._waiting.add((msg.sender, msg.seq))
                jobs.put((peer, msg, entry[0]))

    def _inline(self, inline, msg) -> bool:
        if not callable(inline):
            return bool(inline)
        if self._queued != self._finished:     # the exec thread is busy: keep the order
            return False
        try:
            return bool(inline(self, msg))
        except Exception:   # noqa: BLE001 - a malformed body: the handler itself will say what is wrong
            return False

    def _answer(self, peer, msg, fn, send, error=None, job=False):
        """Run ``fn`` and send its answer. ``job``: an exec job that a ``cancel`` may interrupt:
        it counts as running only until ``fn`` ends, so the interrupt (or a retry of one deferred
        by an import) can never land while the reply is made and sent: a lost reply would keep
        the client waiting, and the task busy, for good."""
        try:
            if error is not None:
                raise error
            if job:
                try:
                    out = fn(self, msg)
                finally:
                    self._running = None
            else:
                out = fn(self, msg)
            if out is None:
                body, bufs = None, ()
            elif out.__class__ is Reply or isinstance(out, Reply):
                body, bufs = out.body, out.buffers
                if body.__class__ is not dict:
                    body = dict(body)
            elif isinstance(out, Mapping):
                body, bufs = (out if out.__class__ is dict else dict(out)), ()
            else:
                raise TypeError(f"the handler of {msg.type!r} returned {type(out).__name__}; a handler "
                                f"returns None, a dict or a Reply")
        except BaseException as e:   # noqa: B036 - reported to the caller, the loop goes on
            if isinstance(e, SystemExit):
                self._stopping = True
            frames = self._signer.pack("reply", msg.sender, {"re": msg.seq, "ok": False, "error": error_info(e)})
        else:
            try:
                frames = self._signer.reply(msg.sender, msg.seq, body, bufs)
            except Exception as e:   # an unsendable result (a dtype we do not ship, ...)
                frames = self._signer.pack("reply", msg.sender, {"re": msg.seq, "ok": False, "error": error_info(e)})
        if self._faults is not None and msg.type != "fault":
            frames = self._fault_out(msg, frames)
            if frames is None:
                return True
        send(peer, frames)
        return True

    def _oneway(self, msg, fn):
        try:
            fn(self, msg)
        except Exception as e:   # noqa: BLE001 - nobody waits for an answer: log it, serve on
            self.stats["oneway_errors"] = self.stats.get("oneway_errors", 0) + 1
            log.warning("%s: the handler of one-way message %r failed: %s", self.name, msg.type, e)

    def _start_exec(self):
        if self._exec_thread is None:
            self._exec_thread = threading.Thread(target=self._exec, name=f"flowlab-exec{self.name}", daemon=True)
            self._exec_thread.start()

    def _exec(self):
        _local.server = self
        post = self._listener.post
        while True:
            try:
                job = self._jobs.get()
            except KeyboardInterrupt:   # a late cancel (an exec thread is interrupted asynchronously)
                continue
            if job is None or self._stopping:
                return
            peer, msg, fn = job
            key = (msg.sender, msg.seq)
            self._waiting.discard(key)
            replied = False
            try:
                if key in self._cancelled:
                    self._cancelled.discard(key)
                    self._answer(peer, msg, None, post, error=KeyboardInterrupt(
                        f"{self.name}: cancelled by the client before it started"))
                    continue
                self._running = key
                try:
                    replied = self._answer(peer, msg, fn, post, job=True)
                finally:
                    self._running = None
            except KeyboardInterrupt:   # a late interrupt (an exec thread's asynchronous one): answer anyway
                if not replied:
                    try:
                        self._answer(peer, msg, None, post,
                                     error=KeyboardInterrupt(f"{self.name}: cancelled by the client"))
                    except KeyboardInterrupt:
                        pass
            finally:
                self._finished += 1

    def serve_exec(self) -> None:
        """Serve: the message loop on a background thread, and the exec jobs (user code from
        ``run``) on *this* thread until the server stops. On the main thread, a ``cancel`` then
        interrupts a running job with a real SIGINT (a LocalCluster worker serves this way)."""
        self._exec_thread = threading.current_thread()
        if self._exec_thread is threading.main_thread():
            _signal.signal(_signal.SIGINT, self._on_sigint)
        self.start()
        self._exec()

    def _on_sigint(self, signum, frame):
        if self._running is not None and self._running == self._cancel_key:
            if _uncuttable(frame):
                # an import cut in half leaves its modules broken for every later call (the lazy
                # flowlab package, numpy), a ring read in half its channel: ask again shortly
                retry = threading.Timer(_CANCEL_RETRY_S, self._resignal, args=(self._running,))
                retry.daemon = True
                retry.start()
                return
            self._cancel_key = None
            raise KeyboardInterrupt(f"{self.name}: cancelled by the client")

    def _resignal(self, key):
        thread = self._exec_thread
        if thread is not None and self._running == key and self._cancel_key == key:
            _signal.pthread_kill(thread.ident, _signal.SIGINT)

    def cancel(self, sender, seq) -> str:
        """Stop the exec job ``(sender, seq)``: ``"running"`` (interrupted now), ``"queued"``
        (it will be skipped) or ``"done"`` (nothing to stop)."""
        key = (sender, seq)
        if key in self._waiting:
            self._cancelled.add(key)
            return "queued"
        if self._running != key or self._exec_thread is None:
            return "done"
        self._cancel_key = key
        thread = self._exec_thread
        if thread is threading.main_thread() and _signal.getsignal(_signal.SIGINT) == self._on_sigint:
            _signal.pthread_kill(thread.ident, _signal.SIGINT)
        else:   # an exec thread: raised between bytecodes (a wait in C finishes first)
            import ctypes
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))
        return "running"

    def _fault_in(self, msg, frames) -> bool:
        """Apply the injected faults to a received message: wait, then drop it or corrupt it (the
        signature check rejects the corrupted copy); True when it is to be handled."""
        from .faults import flip_byte

        faults = self._faults
        faults.wait()
        hit = faults.roll()
        if hit is None:
            return True
        now = _events.now()
        if hit == "drop":
            self.log.record("fault", "dropped", now, now, task=self.name, rank=self.task_index, type=msg.type,
                            peer=msg.sender, direction="in")
            return False
        try:
            self._verifier.unpack(flip_byte(frames, faults.rng))
        except ProtocolError as e:
            self.log.record("fault", "corrupted", now, now, task=self.name, rank=self.task_index, type=msg.type,
                            peer=msg.sender, direction="in")
            self._drop(e, frames)
            return False
        return True   # never: a flipped byte in a signed frame fails the check

    def _fault_out(self, msg, frames):
        """Apply the injected faults to a reply: None (dropped), a corrupted copy, or ``frames``."""
        from .faults import flip_byte

        faults = self._faults
        hit = faults.roll()
        if hit is None:
            return frames
        now = _events.now()
        self.log.record("fault", "dropped" if hit == "drop" else "corrupted", now, now, task=self.name,
                        rank=self.task_index, type="reply", peer=msg.sender, direction="out")
        return None if hit == "drop" else flip_byte(frames, faults.rng)

    def _drop(self, error, frames):
        n = self.stats["dropped"] = self.stats["dropped"] + 1
        if n <= 20 or n % 1000 == 0:
            log.warning("%s dropped a message (%d so far): %s", self.name, n, error)
        now = _events.now()
        self.log.record("drop", type(error).__name__, now, now, bytes=sum(len(f) for f in frames), task=self.name,
                        rank=self.task_index, reason=str(error))


# -- where code is running ----------------------------------------------------------------------
_local = threading.local()
_process_server = None


def current_server() -> Server | None:
    """The server whose handler (or ``run`` function) is running in this thread, else the server
    of this worker process; None outside a cluster task."""
    return getattr(_local, "server", None) or _process_server


def rank() -> int:
    """This task's index in its job, Horovod's ``hvd.rank()``: under ``mpiexec``, the MPI rank; 0 outside
    a cluster."""
    s = current_server()
    if s is None:
        from .collectives.comm import current
        return current().rank
    return s.task_index


def world_size() -> int:
    """How many tasks this task's job has, Horovod's ``hvd.size()``: under ``mpiexec``, the MPI world's
    size; 1 outside a cluster."""
    s = current_server()
    if s is None:
        from .collectives.comm import current
        return current().size
    return s.spec.num_tasks(s.job_name) if s.spec else 1


def _listed_address(spec, job_name, task_index):
    """This task's address in ``spec``; None when the spec does not list it."""
    try:
        return spec.task_address(job_name, task_index) if spec else None
    except ValueError:
        return None


class _UserError(Exception):
    """Carries an exception raised by user code, so its traceback starts at the user's function."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


def error_info(e: BaseException) -> dict:
    """A JSON-safe description of an exception: class, module, message and traceback text."""
    tb = e.__traceback__
    if isinstance(e, _UserError):   # user code raised: show its frames, not the server's
        e = e.error
        tb = e.__traceback__.tb_next if e.__traceback__ is not None and e.__traceback__.tb_next else e.__traceback__
    return {"type": type(e).__qualname__, "module": type(e).__module__, "message": str(e),
            "traceback": "".join(traceback.format_exception(type(e), e, tb))}


# -- built-in handlers ----------------------------------------------------------------------------
@handler("hello")
def _hello(server, msg):
    return {"task": server.name, "id": server.id, "pid": server.pid, "address": server.address,
            "python": list(sys.version_info[:3])}


@handler("ping")
def _ping(server, msg):
    return msg.body


@handler("spec")
def _spec(server, msg):
    server.spec = ClusterSpec({j: ({int(i): a for i, a in t.items()} if isinstance(t, dict) else t)
                               for j, t in msg.body["cluster"].items()})


@handler("run", inline=False)
def _run(server, msg):
    """Buffers: the pickled function, then the pickled ``(args, kwargs)``; reply: the pickled result."""
    code, payload = msg.buffers[0], msg.buffers[1]
    fn = server._code_cache.get(code)
    if fn is None:
        fn = loads(code)
        if len(server._code_cache) >= 64:
            server._code_cache.pop(next(iter(server._code_cache)))
        server._code_cache[code] = fn
    args, kwargs = loads(payload)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    start = _events.now()
    try:
        result = fn(*args, **kwargs)
    except Exception as e:
        raise _UserError(e) from None
    finally:
        server.log.record("op", name, start, _events.now(), task=server.name, rank=server.task_index)
    return Reply({}, [dumps(result)])


def _buffers_of(value):
    return value if isinstance(value, list) else [value]


@handler("put")
def _put(server, msg):
    """Store the message's buffers under ``body["key"]`` (one buffer: the value itself)."""
    start = _events.now()
    bufs = msg.buffers
    server.store.put(msg.body["key"], bufs[0] if len(bufs) == 1 else list(bufs))
    server.log.record("recv", msg.body["key"], msg.body.get("sent", start), _events.now(), bytes=msg.nbytes,
                      task=server.name, rank=server.task_index, peer=msg.body.get("from_task", msg.sender))


@handler("get")
def _get(server, msg):
    value = server.store.get(msg.body["key"])
    if isinstance(value, Pickled):
        return Reply({"pickled": True}, [value])
    return Reply({}, _buffers_of(value))


@handler("delete")
def _delete(server, msg):
    for key in msg.body.get("keys", ()):
        server.store.pop(key)


@handler("push", inline=False)
def _push(server, msg):
    """Send the value named ``key`` to task ``to`` (stored there as ``as``); waits for its receipt."""
    body = msg.body
    value = server.store.get(body["key"])
    to = task_name(*parse_task(body["to"]))
    peers = server.peers()
    if to not in peers:
        if server.spec is None:
            raise ClusterError(f"{server.name} does not know the cluster yet, so cannot reach {to}")
        peers.add(to, server.spec.address_of(to), timeout=min(10.0, body.get("timeout", 120.0)))
    bufs = _buffers_of(value)
    nbytes = sum(getattr(b, "nbytes", None) or len(b) for b in bufs)
    start = _events.now()
    peers.request(to, "put", {"key": body.get("as", body["key"]), "from_task": server.name, "sent": start},
                  bufs, timeout=body.get("timeout", 120.0))
    server.log.record("send", body["key"], start, _events.now(), bytes=nbytes, task=server.name,
                      rank=server.task_index, peer=to)
    return {"bytes": nbytes}


@handler("events")
def _events_handler(server, msg):
    evs = server.log.events(since=msg.body.get("since"))
    out = [e.to_dict() for e in evs]
    if msg.body.get("clear"):
        server.log.clear()
    return {"task": server.name, "events": out, "dropped": server.log.dropped}


@handler("stats")
def _stats(server, msg):
    faults = server.faults.describe() if server.faults is not None else None
    return {"task": server.name, "pid": server.pid, **server.stats, "stored": len(server.store), "faults": faults}


@handler("fault")
def _fault(server, msg):
    """Set or clear this task's injected faults (:mod:`.faults`): body ``delay_ms``, ``drop``,
    ``corrupt``, ``seed``, or ``clear``. Never itself delayed, dropped or corrupted."""
    from .faults import control
    return control(server, msg.body)


@handler("shutdown")
def _shutdown(server, msg):
    server._stopping = True


@handler("cancel")
def _cancel(server, msg):
    """Stop this sender's request ``body["seq"]`` (see :meth:`Server.cancel`); reply ``{"state": ...}``."""
    return {"state": server.cancel(msg.sender, int(msg.body["seq"]))}


@handler("coll-sync")
def _coll_sync(server, msg):
    """This task's collective state, moved forward to ``body["to"]`` or dropped with
    ``body["close"]`` (see ``flowlab.cluster.collectives.zmq.sync``); ``{}`` when the task has
    never formed a group (then the collectives' module may not even be loaded)."""
    mod = sys.modules.get("flowlab.cluster.collectives.zmq")
    if mod is None:
        return {}
    return mod.sync(server, msg.body.get("to"), bool(msg.body.get("close")))


@handler("task-gone", reply=False)
def _task_gone(server, msg):
    """The cluster's monitor says another task died: kept for this task's collectives, which then
    fail at once naming it (``flowlab.cluster.collectives._gone``)."""
    from .collectives._gone import note
    note(server, msg.body)


from . import task_exec as _task_exec  # noqa: E402,F401 - its handlers (op, fetch, partition, ...) serve every task
