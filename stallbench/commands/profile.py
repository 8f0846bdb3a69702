"""``stallbench profile [options] -- COMMAND [ARGS...]``: the user's own job, measured unchanged
(``stallbench.profile`` does the work; this module parses and prints)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import outputs, results
from ..analysis import knob_table
from ..errors import UserError
from ..outputs import one_line
from ..profile import jobrun
from ..profile.jobrun import MAX_PROGRESS_S, MIN_PROGRESS_S
from ..report import profile_lines
from . import numbers

MAX_REPEATS = 1000
MAX_BATCHES = 10**9


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser(
        "profile", help="measure your own training command's data wait, per loader and rank",
        description="Run COMMAND unchanged (python train.py, python -m pkg, torchrun ...) and "
                    "measure every DataLoader and Ray Data iterator in its processes; --set "
                    "tries DataLoader settings on it. Everything after -- is the command.")
    p.add_argument("--out", default="results", help="result directory (default: results/)")
    p.add_argument("--name", default=None, help="result name (default: the script's stem)")
    p.add_argument("--repeats", default="1", metavar="N",
                   help=f"runs per variant, 1..{MAX_REPEATS} (default 1; the gate needs 2)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=V1,V2",
                   help="try these values on the job (repeatable): " + knob_table.listed())
    p.add_argument("--max-batches", default=None, metavar="N",
                   help="end each hooked epoch after N batches (the script sees a shorter epoch)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--analyze", dest="analyze", action="store_true", default=None,
                   help="(default without --live) prove the split: run the first variant "
                        "again with its data path served from memory (compute-only, dataset, "
                        "collate) and attribute the stall; fit the what-if on the worker "
                        "variants")
    g.add_argument("--no-analyze", dest="analyze", action="store_false")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write a Chrome trace-event JSON (Perfetto) of every batch's wait and step, per "
                        "variant, repeat, rank and loader")
    p.add_argument("--progress-timeout", default=None, metavar="S",
                   help="end the job (exit 2) when no batch came for S seconds, counted from "
                        f"its start ({MIN_PROGRESS_S:g}..{MAX_PROGRESS_S:.0e}; default: off, a "
                        "job may go long without a batch)")
    p.add_argument("--record-argv", action="store_true",
                   help="record and print every value of the command (secret-looking ones "
                        "still redacted); by default only the program, the script, flag "
                        "names and numeric, boolean or enumerated values are kept, every "
                        "other value shown as <value>")
    numbers.add_node_args(p, "takes the other nodes' figures on; the same on every node. The nodes "
                     "sign what they send with the token in $STALLBENCH_NODE_TOKEN (needed "
                     "beyond loopback; without it only a shared --out carries the figures)")
    _add_live(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    p.set_defaults(func=run)
    return p


def _add_live(p: argparse.ArgumentParser) -> None:
    """``--live`` and its token flags (issue 60)."""
    lv = p.add_argument_group("live (a job that runs for hours or days; docs/profile.md, Live)")
    lv.add_argument("--live", default=None, metavar="[HOST:]PORT",
                    help="while the job runs, serve its wait, steps and samples per rank, "
                         "loader and node as Prometheus metrics on http://HOST:PORT/metrics "
                         "(HOST: 127.0.0.1 unless given; any other address needs a token), "
                         "show them on the terminal, and keep the stall over time in the "
                         "result; one run of the job (no --repeats, no --set matrix, no "
                         "--analyze)")
    tok = lv.add_mutually_exclusive_group()
    tok.add_argument("--live-token-env", default=None, metavar="NAME",
                     help="environment variable holding the bearer token every scraper must "
                          "send (needed beyond loopback)")
    tok.add_argument("--live-token-file", default=None, metavar="PATH", type=Path,
                     help="file holding that token (one line; keep it chmod 600)")


def print_result(result: results.Result) -> None:
    """The profile's figures, as the one printer writes them (``report.profile_lines``, which
    the HTML report shows too)."""
    for line in profile_lines.lines(result):
        print(line)


def _command(cmd: list[str]) -> list[str]:
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("profile: expected the command after --: stallbench profile [options] "
                        "-- python train.py [ARGS...]")
    return cmd


def run(args: argparse.Namespace) -> int:
    from ..profile import knobs, session

    argv = _command(args.cmd)
    repeats = numbers.integer(args.repeats, "--repeats", 1, MAX_REPEATS) or 1
    max_batches = numbers.integer(args.max_batches, "--max-batches", 1, MAX_BATCHES)
    axes = knobs.parse(args.sets)
    name = jobrun.result_name(args.name, session.default_name(argv))
    out = Path(args.out)
    outputs.check_dir(out, "--out", [results.store.longest_name(name)])
    progress = numbers.number(args.progress_timeout, "--progress-timeout", MIN_PROGRESS_S,
                              MAX_PROGRESS_S)
    node_port, node_wait = numbers.node_args(args)
    trace = None
    if args.trace:
        trace = outputs.check_file(args.trace, outputs.TRACE, "--trace")
    live = _live(args, repeats, axes)
    analyze = args.analyze if args.analyze is not None else live is None
    opts = session.Options(argv=argv, name=name, out=out, repeats=repeats,
                           max_batches=max_batches, axes=axes, analyze=bool(analyze),
                           live=live,
                           trace=[] if trace is not None else None, progress_timeout=progress,
                           record_argv=bool(args.record_argv), node_port=node_port,
                           node_wait=node_wait)
    done = jobrun.measure_and_publish(lambda: session.profile(opts, say=_say), out, trace,
                                      opts.trace)
    if done.result is None:
        print(f"stallbench: {done.line}", file=sys.stderr)
        return done.code
    result = done.result
    # printed only once everything is published: a closed or full stdout costs no file
    print()
    print_result(result)
    print(f"result: {one_line(done.path)}")   # surrogates of non-UTF-8 bytes: never raise
    if trace is not None:
        print(f"trace: {one_line(trace)}")
    if result.analysis.recommendation is not None:
        print(result.analysis.recommendation.text)
    for line in done.lines:     # a node missing from a multi-node result: said last, exit 3
        print(f"stallbench: WARNING: a node is missing from this result: {one_line(line)}",
              file=sys.stderr)
    return done.code


def _live(args: argparse.Namespace, repeats: int, axes: dict):
    """``--live``'s options (``profile.live.options``), checked before anything runs; None
    without it. One run of the job: a matrix, repeats or the ablation runs would run a job
    of days several times."""
    if args.live is None:
        if args.live_token_env is not None or args.live_token_file is not None:
            raise UserError("--live-token-env / --live-token-file: only with --live")
        return None
    from ..errors import need_extra
    need_extra("live", "stallbench profile --live")
    runs = [f"--repeats {repeats}"] if repeats > 1 else []
    if any(len(v) > 1 for v in axes.values()):
        runs.append("a --set matrix")
    if args.analyze:
        runs.append("--analyze")
    if runs:
        raise UserError(f"--live: one run of the job (it may run for days), not {' and '.join(runs)}")
    from ..profile import live
    return live.options(args.live, args.live_token_env, args.live_token_file)


def _say(line: str) -> None:
    """A progress line of the runs, on stderr (stdout is the figures)."""
    print(f"stallbench: {line}", file=sys.stderr, flush=True)
