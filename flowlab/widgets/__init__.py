"""Notebook widgets: thin views over plain objects' ``snapshot()``. The only package that imports
ipywidgets. A lower layer never imports this package: an object names its view as a string
(``_view = "flowlab.widgets.<module>:<Class>"``) and ``flowlab._display.show(obj)`` builds it inside
a kernel. Every view is constructed as ``View(obj)`` and has ``refresh()``."""
