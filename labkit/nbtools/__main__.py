"""`python -m labkit.nbtools execute|check|student|release|size ...`."""
import sys

from labkit.nbtools.chapters import main

sys.exit(main())
