"""The `labkit` command line.

Each sub-command lives in its own module under `labkit/commands/` and defines
`add_parser(subparsers)` and `run(args) -> int`; they are discovered here, so
adding a command never touches this file.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil

import labkit.commands as _commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labkit", description="labkit: LLM inference, built and measured.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(_commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"labkit.commands.{info.name}")
        sp = module.add_parser(sub)
        sp.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    return int(args._run(args) or 0)
