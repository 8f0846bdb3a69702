"""``stallbench profile [options] -- COMMAND [ARGS...]``: the user's own job, measured unchanged
(``stallbench.profile`` does the work; this module parses and prints)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import interrupts, outputs, results
from ..analysis import figures
from ..outputs import one_line
from ..report import tables
from ..errors import UserError
from . import numbers

MAX_REPEATS = 1000
MAX_BATCHES = 10**9
MIN_PROGRESS_S = 1.0        # the hooks report batches at most every 0.5 s (agent beats.BEAT_S)
MAX_PROGRESS_S = 10**7


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
                   help="try these values on the job (repeatable): dataloader.num_workers, "
                        "dataloader.pin_memory, dataloader.prefetch_factor, "
                        "dataloader.persistent_workers, ray.prefetch_batches, "
                        "torch.num_threads (the trainer's intra-op threads)")
    p.add_argument("--max-batches", default=None, metavar="N",
                   help="end each hooked epoch after N batches (the script sees a shorter epoch)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--analyze", dest="analyze", action="store_true", default=True,
                   help="(default) prove the split: run the first variant again with its "
                        "data path served from memory (compute-only, dataset, collate) and "
                        "attribute the stall; fit the what-if on the worker variants")
    g.add_argument("--no-analyze", dest="analyze", action="store_false")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="write a Chrome trace-event JSON (Perfetto) of every batch's wait and step, per "
                        "variant, repeat, rank and loader")
    p.add_argument("--progress-timeout", default=None, metavar="S",
                   help="end the job (exit 2) when no batch came for S seconds, counted from "
                        f"its start ({MIN_PROGRESS_S:g}..{MAX_PROGRESS_S:.0e}; default: off, a "
                        "job may go long without a batch)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    p.set_defaults(func=run)
    return p


def loader_table(result: results.Result) -> str:
    rows = []
    for v in result.variants:
        if v.profile is None:
            continue
        for lo in v.profile.loaders:
            top = max(lo.stages, key=lambda s: s.wall_s, default=None)
            # names the job made: escaped again here, for a result read back from a file
            rows.append([one_line(v.name), one_line(lo.name) + (" *" if lo.headline else ""),
                         str(lo.rank),
                         str(lo.settings.get("num_workers", "-")), f"{lo.batches:,}",
                         tables.format_number(lo.samples_s), tables.format_number(lo.steady_samples_s),
                         figures.seconds_cell(lo.wait_s), tables.format_percent(lo.wait_share),
                         tables.format_percent(lo.steady_wait_share), figures.seconds_cell(lo.step_s),
                         figures.seconds_cell(lo.time_to_first_batch_s),
                         f"{one_line(top.name)} {figures.seconds(top.wall_s)}" if top else "-"])
    head = ["variant", "loader", "rank", "workers", "batches", "samples/s", "steady samples/s",
            "wait s", "wait %", "steady wait %", "step s", "1st batch s", "top stage (wall)"]
    return tables.table(head, rows, right={2, 3, 4, 5, 6, 7, 8, 9, 10, 11})


def print_result(result: results.Result) -> None:
    print("per loader (medians over repeats; * = headline, the loader with most batches; "
          "wait = blocked on the next batch, step = the loop's time between batches):")
    print(loader_table(result))
    for v in result.variants:
        if v.profile is not None and v.profile.ended_early:
            print(f"  {v.name}: {v.profile.ended_early}")
        if v.profile is not None and v.profile.capped:
            print(f"  {v.name}: --max-batches ended the epochs early")
        for loader, note in v.notes.items():
            if not loader.startswith("--analyze"):     # printed with the analysis below
                print(f"  {v.name}: {loader}: {note}")
    ranks = tables.rank_table(result)
    if ranks:
        print()
        print("ranks (exposed stall = the rank's wait for its batches; medians over repeats):")
        print(ranks)
        for line in tables.rank_verdicts(result):
            print(f"  {line}")
    from ..profile import ablate
    for v in result.variants:
        if v.profile is not None and v.profile.analysis is not None:
            print()
            print(f"analysis of {v.name} (--analyze):")
            for line in ablate.lines(v.attribution, v.profile.analysis):
                print(line)
    knee = ablate.knee_lines(result)
    if knee:
        print()
        for line in knee:
            print(line)
    from ..measure.load import busy_summary
    busy = busy_summary(result)
    if busy:
        print(f"WARNING: BUSY MACHINE: {busy}")


def _command(cmd: list[str]) -> list[str]:
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("profile: expected the command after --: stallbench profile [options] "
                        "-- python train.py [ARGS...]")
    return cmd


def result_name(given: str | None, default: str, verb: str = "profile") -> str:
    """The result's name, by the rule scenario names follow (``scenario.name_problem``: it
    names the result file and starts printed lines): refused at entry, exit 2, never escaped
    later by each reader."""
    from ..scenario import name_problem

    name = default if given is None else given
    problem = name_problem(name)
    if problem:
        where = ("--name" if given is not None else
                 "the result name (the script's stem; give one with --name)")
        raise UserError(f"{verb}: {where}: {problem}")
    return name


def run(args: argparse.Namespace) -> int:
    from ..profile import knobs, session

    argv = _command(args.cmd)
    repeats = numbers.integer(args.repeats, "--repeats", 1, MAX_REPEATS) or 1
    max_batches = numbers.integer(args.max_batches, "--max-batches", 1, MAX_BATCHES)
    axes = knobs.parse(args.sets)
    name = result_name(args.name, session.default_name(argv))
    out = Path(args.out)
    outputs.check_dir(out, "--out", [results.store.longest_name(name)])
    progress = numbers.number(args.progress_timeout, "--progress-timeout", MIN_PROGRESS_S,
                              MAX_PROGRESS_S)
    trace = None
    if args.trace:
        trace = outputs.check_file(args.trace, outputs.TRACE, "--trace")
    opts = session.Options(argv=argv, name=name, out=out, repeats=repeats,
                           max_batches=max_batches, axes=axes, analyze=bool(args.analyze),
                           trace=[] if trace is not None else None, progress_timeout=progress)
    # --out is created by the first run's directory: one that profile made and left empty (an
    # error, a job that failed, Ctrl-C, SIGTERM) is removed on the way out (outputs.made_here).
    with outputs.made_here(out):
        try:
            result = session.profile(opts, say=lambda s: print(f"stallbench: {s}",
                                                                file=sys.stderr, flush=True))
        except session.JobFailed as exc:
            print(f"stallbench: {exc}", file=sys.stderr)
            return exc.code
        except session.NodePartsLeft as exc:
            print(f"stallbench: {exc}", file=sys.stderr)
            return 0
        path = publish(result, out, trace, opts.trace)
    # printed only once everything is published: a closed or full stdout costs no file
    print()
    print_result(result)
    print(f"result: {one_line(path)}")   # surrogates of non-UTF-8 bytes: never raise
    if trace is not None:
        print(f"trace: {one_line(trace)}")
    if result.analysis.recommendation is not None:
        print(result.analysis.recommendation.text)
    return 0


def publish(result: results.Result, out: Path, trace: Path | None,
            events: list | None) -> Path:
    """The result and its trace, together or neither: both written whole to temp files
    first (the trace checked again: it may have changed during the run), then linked and
    renamed (``results.save``'s ``also``). A signal before that is exit 130/143 with no file;
    one after it is kept, with the files (``interrupts.committed``)."""
    also: tuple = ()
    if trace is not None:
        from ..profile import trace as trace_mod
        try:
            outputs.check_file(trace, outputs.TRACE, "--trace")
        except UserError as exc:
            raise UserError(f"{exc}; no result written") from None
        also = ((trace, trace_mod.dumps(events or []), "--trace"),)
    with interrupts.deferred():
        path = results.save(result, out, also)
        interrupts.committed()
    outputs.published(path, *([trace] if trace is not None else []))
    return path
