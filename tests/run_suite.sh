#!/usr/bin/env bash
# The test suite in two passes, as `make test` (and so CI) runs it. Usage:
#   TEST_WORKERS=N bash tests/run_suite.sh ["MARKER EXPRESSION"]   (e.g. "not slow")
#
# 1. Every test that does not read a verdict off timings, in TEST_WORKERS pytest-xdist workers
#    (default 3; 1 runs it in one process). Scheduled by a scope per test file
#    (conftest.py's pytest_xdist_make_scheduler), so a file's module fixtures are made once;
#    the files that start multi-process Ray clusters share one scope, handed out first.
#    Much of this pass waits on subprocesses (Ray, Flight servers, signal cases, profiled
#    jobs): with two workers on two cores it kept the CPU 91% busy (a fresh-clone CI run,
#    2026-11-28), so a third worker fills what the waits leave idle.
#    Beside it, from its start, the tests marked `waits` in a pytest process of their own: minutes
#    of waits on other processes at ~10% of a core (the README block's two demo runs). In an
#    xdist worker such a test holds a worker that could run others; beside the pass it costs
#    only its CPU. They read no verdict off timings, as every test of this pass.
# 2. Timing tests, after it: ground truth recovered from timings (groundtruth), real
#    scenarios whose verdicts the test reads (e2e), the same-job A/B gate (abgate). Their
#    tolerances hold beside one busy process, and running them beside other tests would
#    spend that margin: those that burn CPU run one at a time. Beside them, in a pytest of
#    their own, the timing tests marked `waits`: ground truths whose injected costs are all
#    waits (emulated storage, link and step), ~0.1-0.25 of a core over their run. A CPU-bound
#    timing test uses at most ~1.5 of the 2 cores here, so each lane keeps what its
#    tolerances need; run one after the other they idled the machine for ~75 s of the
#    ~330 s pass (a fresh-clone CI run, 2026-11-28: 4-5% busy).
# Then the 15 slowest tests of both passes and each pass's time (tests/slowest.py), so the
# next slow test is seen the day it lands.
#
# Both passes run even when the first fails (every failure is reported); the exit is non-zero
# when either failed, and pytest's 5 ("no tests collected") in either is a broken suite.
set -u
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
only=${1:-}
timing="groundtruth or e2e or abgate"
and_only=${only:+ and ($only)}
workers=${TEST_WORKERS:-3}
# SUITE_REPORTS=DIR keeps each pass's junit XML and lane log there (to read every test's time
# after a CI run); by default they go to a temporary directory removed at exit.
if [ -n "${SUITE_REPORTS:-}" ]; then
  reports=$SUITE_REPORTS; mkdir -p "$reports"; drop=
else
  reports=$(mktemp -d "${TMPDIR:-/tmp}/stallbench-suite-XXXXXX"); drop=$reports
fi
trap 'rm -rf $drop' EXIT
parallel=()
if [ "$workers" -gt 1 ]; then parallel=(-p xdist -n "$workers" --dist loadscope); fi
t0=$SECONDS
"$PY" -m pytest -q -rs --junitxml="$reports/waits.xml" \
  -m "waits and not ($timing)$and_only" > "$reports/waits.log" 2>&1 &
lane=$!
trap 'kill "$lane" 2>/dev/null; rm -rf $drop' EXIT
"$PY" -m pytest -q -rs ${parallel[@]+"${parallel[@]}"} --junitxml="$reports/parallel.xml" \
  -m "not ($timing) and not waits$and_only"
first=$?
wait "$lane"
beside=$?
t1=$SECONDS
echo "tests marked waits, run beside the parallel pass:"
cat "$reports/waits.log"
[ "$beside" -eq 5 ] && beside=0     # none selected (a marker expression that leaves them out)
"$PY" -m pytest -q -rs --junitxml="$reports/timing-waits.xml" \
  -m "waits and ($timing)$and_only" > "$reports/timing-waits.log" 2>&1 &
lane=$!
"$PY" -m pytest -q -rs --junitxml="$reports/timing.xml" -m "($timing) and not waits$and_only"
second=$?
wait "$lane"
waited=$?
lane=
t2=$SECONDS
echo "timing tests marked waits, run beside the timing pass:"
cat "$reports/timing-waits.log"
[ "$waited" -eq 5 ] && waited=0
"$PY" tests/slowest.py --top 15 \
  "parallel pass ($workers worker(s))=$reports/parallel.xml=$((t1 - t0))" \
  "waits lane (beside the parallel pass)=$reports/waits.xml=beside" \
  "timing pass=$reports/timing.xml=$((t2 - t1))" \
  "timing waits lane (beside the timing pass)=$reports/timing-waits.xml=beside"
for rc in $first $second; do
  if [ "$rc" -eq 5 ]; then echo "pytest collected no tests in one of the two passes: the suite is broken"; exit 1; fi
done
echo "test passes: the rest ($workers worker(s)) rc $first, waits lane rc $beside, timing tests rc $second, timing waits lane rc $waited"
[ "$first" -eq 0 ] && [ "$beside" -eq 0 ] && [ "$second" -eq 0 ] && [ "$waited" -eq 0 ]
