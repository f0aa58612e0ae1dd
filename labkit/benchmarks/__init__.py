"""Benchmarks run by `labkit bench`, one submodule per topic.

Each submodule defines `TITLE` (one line) and `run(quick: bool) -> dict`, which
prints its figures as it goes and returns them for the JSON report. Benchmarks
measure; nothing in the test suite asserts a wall-clock number.
"""
