"""Widget test helpers: a comm that records what a widget sends, and a click as the front end sends it."""


class RecordingComm:
    """Stands in for the kernel's comm (the one thing a widget needs a kernel for): every message a
    widget sends to the front end is kept in ``sent`` as ``(msg_type, data)``. Made by
    ``comm.create_comm``, which ipywidgets calls when a widget opens."""

    def __init__(self, **kwargs):
        self.comm_id = kwargs.get("comm_id") or f"comm-{id(self):x}"
        self.target_name = kwargs.get("target_name")
        self.sent = [("comm_open", kwargs.get("data"))]
        self._msg_callback = None
        self._close_callback = None
        self.kernel = "recording"      # ipywidgets sends nothing to a comm without a kernel

    def send(self, data=None, metadata=None, buffers=None):
        self.sent.append(("comm_msg", data))

    def close(self, data=None, metadata=None, buffers=None, deleting=False):
        self.sent.append(("comm_close", data))

    def on_msg(self, callback):
        self._msg_callback = callback

    def on_close(self, callback):
        self._close_callback = callback

    def handle_msg(self, msg):
        """As if the front end sent ``msg`` (``{"content": {"data": ...}}``)."""
        if self._msg_callback:
            self._msg_callback(msg)

    def updates(self, name):
        """The values of synced trait ``name`` sent to the front end, oldest first."""
        return [d["state"][name] for kind, d in self.sent
                if kind == "comm_msg" and d and d.get("method") == "update" and name in d.get("state", {})]

    def custom(self):
        """The custom messages the widget sent (replies to actions), oldest first."""
        return [d["content"] for kind, d in self.sent
                if kind == "comm_msg" and d and d.get("method") == "custom"]


def click(view, action, **args):
    """Send ``view`` the message its front end sends for a user action; returns the view's reply."""
    view.comm.handle_msg({"content": {"data": {"method": "custom",
                                               "content": {"action": action, "args": args, "id": 7}}},
                          "buffers": []})
    return view.comm.custom()[-1]


class DisplayHandle:
    """What IPython's ``display(..., display_id=True)`` returns: keeps the bundle first shown
    (``shown``) and records every update (``updates``)."""

    def __init__(self, data):
        self.shown, self.updates = data, []

    def update(self, data, metadata=None, raw=False):
        self.updates.append(data)


def display_in_kernel(monkeypatch):
    """Make flowlab believe it runs in a kernel: ``flowlab._display.in_kernel`` says so and IPython's
    ``display`` is stood in for: a view displays itself (over the test's recording comm, so take the
    ``widget_comm`` fixture too), a raw bundle shown with ``display_id=True`` gets a DisplayHandle.
    Returns the list of handles made, oldest first."""
    import IPython.display

    import flowlab._display as display
    handles = []

    def fake_display(obj, metadata=None, raw=False, display_id=None, **kwargs):
        if not raw:                      # display(view): IPython asks the view to display itself
            return obj._ipython_display_()
        assert display_id is True
        handles.append(DisplayHandle(obj))
        return handles[-1]

    monkeypatch.setattr(display, "in_kernel", lambda: True)
    monkeypatch.setattr(IPython.display, "display", fake_display)
    return handles
