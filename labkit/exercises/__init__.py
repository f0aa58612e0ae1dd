"""Self-checking exercises: `check_<name>(fn)` runs a learner's function against the reference on several cases and prints a pass line or a precise hint.

Names come from the submodules' `__all__` (see `labkit._collect`).
"""
from labkit._collect import make_getattr

__getattr__, __dir__ = make_getattr(__name__)
