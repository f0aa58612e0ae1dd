"""Thin wrappers that wire ipywidgets sliders to the pure figure functions in `labkit.viz`.

Names come from the submodules' `__all__` (see `labkit._collect`).
"""
from labkit._collect import make_getattr

__getattr__, __dir__ = make_getattr(__name__)
