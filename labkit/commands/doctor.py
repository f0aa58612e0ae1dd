"""`labkit doctor`: check the environment, one [OK]/[FAIL] line per requirement."""
from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("doctor", help="check that the lab's environment is ready")
    p.add_argument("--no-measure", action="store_true", help="skip the ~1 s memory-bandwidth test")
    return p


def run(args) -> int:
    from labkit import doctor

    return doctor.run(measure=not args.no_measure)
