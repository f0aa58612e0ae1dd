# labkit: `make lab` runs the lab, `make test` passes the tests.
VENV    ?= .venv
PY      := $(VENV)/bin/python
BUILD   := $(CURDIR)/.build
PORT    ?= 8888
# Jupyter and IPython keep their state inside the build tree, not in $HOME.
export JUPYTER_CONFIG_DIR  := $(BUILD)/jupyter/config
export JUPYTER_DATA_DIR    := $(BUILD)/jupyter/data
export JUPYTER_RUNTIME_DIR := $(BUILD)/jupyter/runtime
export IPYTHONDIR          := $(BUILD)/ipython
export MPLCONFIGDIR        := $(BUILD)/mpl
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-sanitize-with nbval_sanitize.cfg

.PHONY: evidence evidence-check setup lab test test-unit test-notebooks test-portable test-isa test-browser test-browser-all notebooks student release bench doctor data clean

setup:
	@bash scripts/setup.sh

lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.ip=127.0.0.1 --port $(PORT) notebooks/00_welcome.ipynb $(LAB_ARGS)

# The suite on TEST_WORKERS processes (pytest-xdist, a file's tests on one worker), each on one thread: on 2 cores
# about two thirds of one process's time; `labkit` for its docstrings' examples (--doctest-modules). The chapters'
# outputs reproduce with one thread (make test-portable's first run checks it); TEST_WORKERS=0 runs everything in
# this process (still one thread).
TEST_WORKERS ?= 2
test: setup
	$(VENV)/bin/labkit bench --check
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VENV)/bin/pytest tests notebooks labkit --doctest-modules $(NBVAL_FLAGS) \
		-n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-unit: setup
	$(VENV)/bin/pytest tests -m "not browser" $(PYTEST_ARGS)

test-notebooks: setup
	$(VENV)/bin/pytest notebooks $(NBVAL_FLAGS) $(PYTEST_ARGS)

# every chapter (or NB=...) under nbval with one thread, then with a busy CPU: outputs must reproduce anywhere
test-portable: setup
	bash scripts/test_portable.sh $(NB)

# the kernel-dependent unit tests under an emulated AVX2 CPU and with no SIMD (ISA=avx2 or ISA=default for one)
test-isa: setup
	bash scripts/test_isa.sh $(ISA)

test-browser: setup
	$(VENV)/bin/pytest tests -m browser $(PYTEST_ARGS)

# every chapter in JupyterLab in headless Chromium (several minutes; make test runs the welcome chapter)
test-browser-all: setup
	LABKIT_BROWSER_ALL=1 $(VENV)/bin/pytest tests/test_browser_chapters.py $(PYTEST_ARGS)

# Re-execute chapters in place (all, or NB=notebooks/05_sampling.ipynb).
notebooks: setup
	$(PY) -m labkit.nbtools execute $(or $(NB),notebooks/[0-9]*.ipynb)

student: setup
	$(PY) -m labkit.nbtools student notebooks/[0-9]*.ipynb --out .build/student

# nbgrader: source and release versions of every chapter in .build/course (its course directory).
release: setup
	$(PY) -m labkit.nbtools release notebooks/[0-9]*.ipynb --root $(BUILD)/course

# re-make every stored file in data/ that today's code did not make (resumable: a second run starts where one
# stopped; each bench's output in .build/evidence/NAME.log). In the background: nohup make evidence > evidence.log &
evidence: setup
	$(PY) -m labkit.benchmarks.evidence run $(if $(ONLY),--only $(ONLY))

evidence-check: setup
	$(VENV)/bin/labkit bench --check

bench: setup
	$(VENV)/bin/labkit bench --json bench.json $(BENCH_ARGS)

doctor: setup
	$(VENV)/bin/labkit doctor

data: setup
	$(PY) -m labkit.data.corpus build

clean:
	rm -rf $(BUILD) .build/student
