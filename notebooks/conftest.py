"""nbval on the chapters: plotly figures are compared by what a reader sees (`labkit.nbtools.figures`)."""
from labkit.nbtools import figures


def pytest_configure(config):
    figures.install()


def pytest_assertrepr_compare(config, op, left, right):
    return figures.assertrepr(left, right)


def pytest_report_header(config):
    """Every run names the CPU and the instruction set its kernels ran with (an emulated one included)."""
    from labkit.costmodel.cpu import describe

    return f"labkit: {describe()}"
