"""Pure functions that build the lab's figures (plotly), one submodule per chapter. Each is tested by pytest; `labkit.widgets` only wires sliders to them.

Names come from the submodules' `__all__` (see `labkit._collect`).
"""
from labkit._collect import make_getattr

__getattr__, __dir__ = make_getattr(__name__)
