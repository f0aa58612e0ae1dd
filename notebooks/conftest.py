"""nbval on the chapters: plotly figures are compared by what a reader sees (`labkit.nbcompare`)."""
from labkit import nbcompare


def pytest_configure(config):
    nbcompare.install()


def pytest_assertrepr_compare(config, op, left, right):
    return nbcompare.assertrepr(left, right)
