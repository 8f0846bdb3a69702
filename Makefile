# The two commands a new user needs (see README):
#   make demo   - set up .venv, install stallbench, run the demo scenario, render the report
#   make test   - set up if needed, then run the whole test suite
VENV    ?= .venv
PY      := $(VENV)/bin/python
SB      := $(VENV)/bin/stallbench
STAMP   := $(VENV)/.installed
PYTHON  ?= python3
# The torch `make setup` installs first: the CPU build (on local disk here; an unpinned torch
# would pull a multi-GB CUDA build). The package itself accepts any torch >= 2.3, so in a
# training environment `pip install -e .` keeps the torch that is there.
TORCH   ?= torch==2.13.0

.PHONY: setup demo test test-all browser ci-gate ci-ab clean-cache peers

# pip compiles every installed module to bytecode one file at a time (~35 s of the ~60 s set-up
# here, torch alone ~20 s); compileall does the same on every core (-j 0). The bytecode is
# needed: where PYTHONDONTWRITEBYTECODE is set (many images), an uncompiled torch costs every
# process ~2 s more to import. Its exit status is ignored as pip ignores it: a few files in
# third-party packages are not Python 3 (templates, test data).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile '$(TORCH)'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-compile -e '.[dev]'
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
	touch $(STAMP)

# The checkout's own Python compiled too, at every `make` that sets up (only what changed
# since: compileall compares each file's time stamp): under PYTHONDONTWRITEBYTECODE nothing is
# cached, and every `stallbench` process and Ray worker of the test suite would compile the
# package again (~0.4 s of CPU each, some 400 processes in the suite's parallel pass).
setup: $(STAMP)
	@$(PY) -m compileall -q -j 0 stallbench tests benchmarks >/dev/null 2>&1 || true

demo: setup
	$(SB) run scenarios/demo.toml --out results
	$(SB) report results -o report/index.html
	@echo "report: report/index.html"

# Headless Chromium for the report's browser test (Debian's package; needs root + apt).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the browser test"; \
	    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium not found and cannot be installed here: the browser test will be skipped"; fi; }

# sync first: a fresh setup leaves GBs of dirty pages whose writeback would compete with the
# timing tests that run first.
# `make test` leaves out the tests marked `slow` (tests/slow_tests.txt, and the A/B gate's ground-truth
# runs in tests/gate/test_ab_e2e.py) so that CI stays well under its time limit; `make test-all`
# runs every test.
# Two passes (tests/run_suite.sh): every test that does not read a verdict off timings, in
# TEST_WORKERS pytest-xdist workers (the `waits` tests beside them, in a process of their own);
# then the tests whose verdicts are read off timings
# (markers groundtruth, e2e, abgate), alone. It ends with the 15 slowest tests.
TEST_WORKERS ?= 3
test: setup browser
	@sync; TEST_WORKERS=$(TEST_WORKERS) bash tests/run_suite.sh "not slow"

test-all: setup browser
	@sync; TEST_WORKERS=$(TEST_WORKERS) bash tests/run_suite.sh

# Same-job A/B (docs/ci-gate.md): the previous commit's code against the working tree's on
# the CI scenarios, interleaved in this job. Exit 1 (a slowdown the confirmation rerun saw too)
# fails. Without HEAD~1 (a shallow clone, the first commit) or when the gate cannot compare
# (exit 2: e.g. HEAD~1's stallbench cannot run today's scenario), it says so loudly and the
# committed baseline (ci-gate, run after it) is the only reference for this run.
ci-ab: setup
	@if ! git rev-parse --verify --quiet 'HEAD~1^{commit}' >/dev/null 2>&1 && \
	   [ "$$(git rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then \
	  echo "ci-ab: shallow clone; fetching one more commit for the A/B"; \
	  git fetch --quiet --deepen=1 2>/dev/null || true; fi; \
	if git rev-parse --verify --quiet 'HEAD~1^{commit}' >/dev/null 2>&1; then \
	  $(SB) gate --against HEAD~1 scenarios/ci/*.toml --repeats 12; rc=$$?; \
	  if [ $$rc -eq 2 ]; then \
	    echo "ci-ab: WARNING: the same-job A/B against HEAD~1 could not compare (error above);" \
	         "the committed baseline (make ci-gate) is the only reference for this run"; rc=0; fi; \
	  exit $$rc; \
	else \
	  echo "ci-ab: WARNING: HEAD~1 is not in this clone (shallow clone or first commit): no" \
	       "same-job A/B; the committed baseline (make ci-gate) is the only reference for this run"; \
	fi

# Petastorm for benchmarks/peers.py, in its own venv (.venv-peers): it needs pyarrow < 15 and
# numpy < 2, which stallbench's own venv must not get. torch and the rest are shared with
# $(VENV) through a .pth file, so nothing large is downloaded twice.
PEERS   ?= .venv-peers
$(PEERS)/.installed: pyproject.toml $(STAMP)
	$(PYTHON) -m venv $(PEERS)
	$(PY) -c 'import sys; print("\n".join(p for p in sys.path if p.endswith("site-packages")))' \
	  > "$$($(PEERS)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_stallbench_venv.pth"
	$(PEERS)/bin/pip install --quiet --disable-pip-version-check \
	  $$($(PY) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["peers"]))')
	touch $@

peers: $(PEERS)/.installed

# The CI regression gate: small scenarios against the committed baseline. A slower row (exit 1)
# is measured again, as the same-job A/B confirms its own (docs/ci-gate.md): the baseline was
# recorded on another day, and a slow phase of a shared VM during the 5 repeats (-12%, seen
# once, while the A/B beside it measured both trees alike) is not a regression. The gate fails
# when the rerun is slower too; any other exit is final.
ci-gate: setup
	$(SB) run scenarios/ci/*.toml --out build/ci-results --no-progress
	@$(SB) gate --baseline results/baseline --current build/ci-results --threshold 10%; rc=$$?; \
	if [ $$rc -eq 1 ]; then \
	  echo "ci-gate: slower than the committed baseline; measuring again to confirm"; \
	  rm -rf build/ci-confirm; \
	  $(SB) run scenarios/ci/*.toml --out build/ci-confirm --no-progress && \
	  $(SB) gate --baseline results/baseline --current build/ci-confirm --threshold 10%; rc=$$?; \
	  [ $$rc -eq 1 ] && echo "ci-gate: FAIL: the rerun is slower than the baseline too"; \
	fi; exit $$rc

clean-cache:
	rm -rf .cache/stallbench
