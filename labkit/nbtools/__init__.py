"""Notebook tooling: the chapters (`chapters`: execute, check, student copies, the nbgrader release) and how nbval
compares their stored figures (`figures`). `python -m labkit.nbtools --help` is the command line."""
from labkit.nbtools.chapters import SOLUTION_TAG, execute, main, problems, stub_source, student_copy, write_students

__all__ = ["SOLUTION_TAG", "execute", "problems", "stub_source", "student_copy", "write_students", "main"]
