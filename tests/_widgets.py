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
