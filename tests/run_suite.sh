#!/usr/bin/env bash
# The test suite in two passes, as `make test` (and so CI) runs it. Usage:
#   TEST_WORKERS=2 bash tests/run_suite.sh ["MARKER EXPRESSION"]   (e.g. "not slow")
#
# 1. Timing tests, alone: ground truth recovered from timings (groundtruth), real scenarios
#    whose verdicts the test reads (e2e), the same-job A/B gate (abgate). Their tolerances
#    hold beside one busy process, and running them beside each other would spend that margin.
# 2. Every other test, in TEST_WORKERS pytest-xdist workers; --dist loadfile keeps a test file
#    on one worker, so its module fixtures (a `ray start` cluster, a served dataset) are made
#    once. Each worker has its own session Ray runtime; tests that start clusters keep them in
#    their own temp dirs and ports (tests/raystart.py), so workers never see each other's.
#
# Both passes run even when the first fails (every failure is reported); the exit is non-zero
# when either failed, and pytest's 5 ("no tests collected") in either is a broken suite.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
only=${1:-}
timing="groundtruth or e2e or abgate"
and_only=${only:+ and ($only)}
"$PY" -m pytest -q -rs -m "($timing)$and_only"
first=$?
"$PY" -m pytest -q -rs -p xdist -n "${TEST_WORKERS:-2}" --dist loadfile -m "not ($timing)$and_only"
second=$?
for rc in $first $second; do
  if [ "$rc" -eq 5 ]; then echo "pytest collected no tests in one of the two passes: the suite is broken"; exit 1; fi
done
echo "test passes: timing tests rc $first, the rest (${TEST_WORKERS:-2} workers) rc $second"
[ "$first" -eq 0 ] && [ "$second" -eq 0 ]
