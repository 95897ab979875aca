"""``SnapshotView``: the one mechanism behind every flowlab widget.

A view is an anywidget model over a plain object. It holds one synced trait, ``snapshot`` (the
object's JSON-safe ``snapshot()``, or what :meth:`SnapshotView.read` makes of it), which a daemon
thread may re-read every ``every`` seconds; the front end (an ES module in a ``.js`` file beside this
one) draws that dict and nothing else. A user action in the browser is one custom message,
``{"action": name, "args": {...}, "id": n}``; the view calls its method ``do_<name>(**args)`` if
``name`` is in its ``actions``, answers ``{"reply": n, "ok": true, "result": ...}`` or
``{"reply": n, "error": "..."}``, and refreshes. Python code and tests call the same path with
:meth:`SnapshotView.act`.

Why messages work while a cell runs: JupyterLab 4.4+ sends comm messages to a kernel subshell
(ipykernel 7), so ``do_*`` runs in another thread while the main thread is busy; a ``do_*`` method
must therefore only do thread-safe work (signal a process, set a flag, read a snapshot).

The JavaScript of a view is ``_common.js`` (helpers every view uses) followed by the view's own
file, joined here once per class: anywidget loads one module, with no bundler and nothing from a CDN.
"""
from __future__ import annotations

import math
import threading
from pathlib import Path

import anywidget
import traitlets

__all__ = ["SnapshotView", "FinalDisplay", "esm", "css", "json_safe"]

_HERE = Path(__file__).parent


def _read(names) -> str:
    return "\n".join((_HERE / n).read_text(encoding="utf-8") for n in names)


def esm(*names: str) -> str:
    """The ES module of a view: ``_common.js`` then each named file in this folder."""
    return _read(("_common.js", *names))


def css(*names: str) -> str:
    """The stylesheet of a view: ``_common.css`` then each named file in this folder."""
    return _read(("_common.css", *names))


def json_safe(value):
    """``value`` with tuples as lists, numpy scalars and arrays as Python numbers and lists, NaN and
    infinities as None and unknown objects as their ``str``: what a synced trait can carry."""
    if value is None or isinstance(value, (bool, str, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    tolist = getattr(value, "tolist", None)       # numpy scalars and arrays
    if callable(tolist):
        return json_safe(tolist())
    return str(value)


def _keep_the_front_ends_subshell(comm) -> None:
    """Let a click reach the kernel subshell JupyterLab sent it to.

    ipykernel 7.4 sends a comm's incoming messages to the subshell of the *last message the comm
    published* (``Comm._reply_subshell_for``), overriding the subshell the front end chose. A view's
    refresh thread publishes with the main shell's parent, so after its first update every click
    was queued behind the running cell (measured: a Kill clicked during a 15 s cell ran when the
    cell ended). A view never waits for an answer from the front end, so the front end's choice is
    the right one."""
    if comm is not None and callable(getattr(comm, "_reply_subshell_for", None)):
        comm._reply_subshell_for = lambda data, default: default


class SnapshotView(anywidget.AnyWidget):
    """The live view of ``obj``: ``snapshot`` mirrors ``self.read()``; ``actions`` names the
    ``do_<name>`` methods the front end may call. Subclasses set ``_esm``/``_css`` (with
    :func:`esm`/:func:`css`), ``actions``, and ``every`` (seconds between background refreshes;
    0: refresh only when asked)."""

    snapshot = traitlets.Dict().tag(sync=True)
    actions: tuple = ()
    every: float = 0.0

    def __init__(self, obj, every: float | None = None, **kwargs):
        self.obj = obj
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self.refreshes = 0                 # how many snapshots differed and were sent
        super().__init__(snapshot=self.read(), **kwargs)    # the first snapshot travels with the comm's open
        _keep_the_front_ends_subshell(self.comm)
        self.on_msg(self._on_msg)
        every = self.every if every is None else every
        if every:
            threading.Thread(target=self._tick, args=(every,), daemon=True,
                             name=f"flowlab-{type(self).__name__}").start()

    # -- what is drawn ------------------------------------------------------------------------
    def read(self) -> dict:
        """The dict to draw; by default ``self.obj.snapshot()`` made JSON-safe."""
        return json_safe(self.obj.snapshot())

    def refresh(self) -> dict:
        """Re-read the snapshot and send it to the front end if it changed; returns it."""
        with self._lock:
            snap = self.read()
            if snap != self.snapshot:
                self.snapshot = snap
                self.refreshes += 1
            return snap

    def _tick(self, every):
        while not self._stop.wait(every):
            try:
                if self.refresh().get("closed"):
                    return
            except Exception:   # noqa: BLE001 - the object or the comm is gone: stop quietly
                return

    # -- what the user does -------------------------------------------------------------------
    def act(self, action: str, **args) -> dict:
        """Run one user action as the front end would (``do_<action>(**args)``) and return the
        reply: ``{"action", "ok": True, "result"}`` or ``{"action", "error"}``. Never raises."""
        reply: dict = {"action": action}
        if action not in self.actions:
            reply["error"] = (f"{type(self).__name__} has no action {action!r}; "
                              f"it has {', '.join(self.actions) or 'none'}")
            return reply
        try:
            reply["result"] = json_safe(getattr(self, "do_" + action)(**args))
            reply["ok"] = True
        except Exception as e:   # noqa: BLE001 - shown in the view: a click must not raise into the void
            reply["error"] = f"{type(e).__name__}: {e}"
        try:
            self.refresh()
        except Exception:   # noqa: BLE001 - the object closed under the view
            pass
        return reply

    def _on_msg(self, _widget, content, _buffers):
        if not isinstance(content, dict) or "action" not in content:
            return
        args = content.get("args") or {}
        reply = self.act(str(content["action"]), **(args if isinstance(args, dict) else {}))
        reply["reply"] = content.get("id")
        self.send(reply)

    # -- display ------------------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs):
        """The widget, plus the object's own text and static HTML (what GitHub, nbconvert and a
        notebook opened without its kernel show)."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        data["text/plain"] = repr(self.obj)
        html = getattr(self.obj, "_repr_html_", None)
        if callable(html):
            data["text/html"] = html()
        return data, metadata

    def __repr__(self):
        return f"{type(self).__name__}({self.obj!r})"

    def close(self):
        if hasattr(self, "_stop"):
            self._stop.set()
        super().close()


class FinalDisplay:
    """A mixin for a SnapshotView whose object ends (a fit, a pipeline run): the view is displayed
    with a display id, and ``show_final()`` replaces that display's text and static HTML (and the
    widget, the same model) with the object's state now, so that a saved notebook shows how it
    ended instead of how it began. Call it once, when the object has ended."""

    _handle = None
    _final_shown = False

    def _ipython_display_(self):
        from IPython.display import display
        bundle = self._repr_mimebundle_()
        if bundle is None:
            return
        data, metadata = bundle
        self._handle = display(data, metadata=metadata, raw=True, display_id=True)

    def show_final(self):
        if self._final_shown:
            return
        self._final_shown = True
        if self._handle is None:
            return
        try:
            bundle = self._repr_mimebundle_()
            if bundle is not None:
                data, metadata = bundle
                self._handle.update(data, metadata=metadata, raw=True)
        except Exception:   # noqa: BLE001 - the display may be gone; the object's work must not fail for it
            pass
