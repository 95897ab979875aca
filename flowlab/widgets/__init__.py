"""Notebook widgets: thin views over plain objects' ``snapshot()``. The only package that imports
ipywidgets. Not built yet (see the widget issues)."""
