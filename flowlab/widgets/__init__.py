"""Notebook widgets: anywidget views over plain objects' ``snapshot()``, the only package that imports
ipywidgets or anywidget. A lower layer never imports this package: an object names its view as a
string (``_view = "flowlab.widgets.<module>:<Class>"``) and ``flowlab._display`` builds it inside a
kernel. Every view is a :class:`flowlab.widgets._view.SnapshotView`: built as ``View(obj)``, one
synced ``snapshot`` trait, user actions as ``do_<name>`` methods, JavaScript and CSS in files here."""
