# The two commands a new user needs (see README):
#   make demo   - set up .venv, install stallbench, run the demo scenario, render the report
#   make test   - set up if needed, then run the whole test suite
VENV    ?= .venv
PY      := $(VENV)/bin/python
SB      := $(VENV)/bin/stallbench
STAMP   := $(VENV)/.installed
PYTHON  ?= python3

.PHONY: setup demo test browser ci-gate clean-cache

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

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
test: setup browser
	@sync; $(PY) -m pytest -q -rs; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: the suite is broken"; exit 1; fi; \
	exit $$rc

# The CI regression gate: small scenarios against the committed baseline.
ci-gate: setup
	$(SB) run scenarios/ci/*.toml --out build/ci-results --no-progress
	$(SB) gate --baseline results/baseline --current build/ci-results --threshold 10%

clean-cache:
	rm -rf .cache/stallbench
