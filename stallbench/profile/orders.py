"""Runs that node rank 0 chooses as it goes, run on every node of a multi-node torchrun (issue
56): ``tune``'s trials and ``profile --analyze``'s ablation runs.

A ``profile --set`` matrix is fixed, so every node's launcher runs it in the same order by
itself. A tune chooses each trial from the ones before, and the ablation runs are planned
from the full runs' figures (the batches to keep, the recording budget), which node rank 0
alone holds merged. So node rank 0 publishes each such run before starting its own
(``nodes.Link.order``: the run's name, its ``--set`` overrides, its replay plan) and every
other node's launcher runs what it is handed (``follow``), ends it when node rank 0 ends its
own (a trial's rate known, a hang), and hands its figures back after it as for any run.

``lead`` is node rank 0's side of one run: ordered, run, ended on every node together, the
other nodes' figures merged into it (``nodes.merge_into``), a node whose job failed failing
the run, and a node whose launcher is gone ending the verb, named: every later run's
rendezvous would wait for it, and a run that hung for it says nothing of its settings.

Where the orders travel: node rank 0's endpoint only (``endpoint``: signed with
``STALLBENCH_NODE_TOKEN``, loopback without one). A shared ``--out`` carries figures, never
a choice made as the verb goes: ``reach`` says whether orders can travel, and both sides
decide from it alike.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from ..errors import UserError
from . import nodes as nodes_mod
from .agent.wire import NodeOrder, ReplayPlan
from .launcher import JobRun, NoProgress, exit_status, run_once


def reach(topo: nodes_mod.Topology) -> str:
    """"" where node rank 0 can hand runs to the other nodes (one node; a token; node rank
    0 on loopback), else why not, in words."""
    from ..auth import tokens
    if topo.count <= 1 or nodes_mod.node_token() is not None or tokens.is_loopback(topo.host):
        return ""
    return (f"${nodes_mod.TOKEN_ENV} is not set (node rank 0's endpoint, "
            f"{topo.host}:{topo.port}, is beyond loopback; give every node the same token)")


def _portable(replay: ReplayPlan | None, run_root: Path) -> dict[str, Any] | None:
    """The plan as an order carries it: a recording's folder relative to the run root, as
    every node keeps its own recording under its own."""
    if replay is None:
        return None
    d = replay.to_json()
    if replay.dir:
        try:
            d["dir"] = str(Path(replay.dir).relative_to(run_root))
        except ValueError:
            pass
    return d


def _local(order: NodeOrder, run_root: Path, made: set[Path]) -> ReplayPlan | None:
    """The order's plan on this node: a recording's folder under this node's run root
    (made for a recording run, and kept in ``made`` to be removed at the end); a folder
    that is not a plain relative path under it is refused."""
    if order.replay is None:
        return None
    plan = ReplayPlan.from_json(order.replay)
    if not plan.dir:
        return plan
    rel = Path(plan.dir)
    if rel.is_absolute() or ".." in rel.parts:
        raise UserError(f"node rank 0 sent a recording folder outside the run: {plan.dir!r}")
    folder = run_root / rel
    if plan.mode == "record":
        folder.mkdir(parents=True, exist_ok=True)
        made.add(folder)
    return ReplayPlan.from_json(order.replay | {"dir": str(folder)})


def lead(link: nodes_mod.Link | None, argv: list[str], run_root: Path, run_dir: Path,
         overrides: dict[str, Any], max_batches: int | None, replay: ReplayPlan | None,
         label: str, say: Callable[[str], None],
         stop: Callable[[Path], str] | None = None, said: str = "") -> JobRun:
    """One run of node rank 0's choosing, on every node (one node, or no ``link``: just the
    run). ``stop``: ``run_once``'s; when it ends the run here, the other nodes end theirs.
    ``label`` names the run in lines; ``said``, where given, is what the other nodes say
    they run."""
    if link is None or not link.multi:
        return run_once(argv, run_dir, overrides, max_batches, replay, stop=stop)
    link.before(run_dir)
    link.order(run_dir, overrides, _portable(replay, run_root), said or label)

    def everywhere(d: Path) -> str:
        late = link.late()
        if late:        # the job's rendezvous waits for it: ended here, the node named
            link.stopping(run_dir, "a node never took the run")
            raise UserError(f"{label}: node rank {late[0]} never took this run from node rank "
                            f"0 within {link.wait_s:g} s (--node-wait): it cannot reach "
                            f"{link.topo.host}:{link.topo.port}, or its launcher is gone; "
                            "node rank 0 cannot go on without it: no result")
        why = stop(d) if stop is not None else ""
        if why:
            link.stopping(run_dir, why)
        return why

    try:
        run = run_once(argv, link.node_dir(run_dir), overrides, max_batches, replay,
                       stop=everywhere)
    except NoProgress as exc:
        link.stopping(run_dir, str(exc))
        _reports(link, run_dir, 2, label)       # a node gone is why, not this run's settings
        raise
    code = 0 if run.stopped else exit_status(run.exit_code)
    reports = _reports(link, run_dir, code, label)
    for r in reports:
        where = f"{label}: node rank {r.node}{f' ({r.host})' if r.host else ''}"
        if r.failed and not run.stopped and run.exit_code == 0:
            run.exit_code = r.exit_code         # the job failed there: the run failed
            say(f"{where}: {r.why}")
        elif not r.measured and not r.failed:
            say(f"{where}: {r.why}")
    nodes_mod.merge_into(run, [link.own(link.node_dir(run_dir), code), *reports])
    return run


def _reports(link: nodes_mod.Link, run_dir: Path, code: int, label: str
             ) -> list[nodes_mod.NodeReport]:
    """The other nodes' reports of the run; ``UserError`` (the node named) where one never
    reported or was refused."""
    reports = link.after(run_dir, code)
    for r in reports:
        if not r.measured and not r.failed and r.folder is None:
            raise UserError(f"{label}: node rank {r.node}{f' ({r.host})' if r.host else ''}: "
                            f"{r.why}; node rank 0 cannot go on without one of its nodes (each "
                            "run is the whole job): no result")
    return reports


def follow(link: nodes_mod.Link, argv: list[str], run_root: Path, say: Callable[[str], None],
           max_batches: int | None = None) -> None:
    """Another node: each run node rank 0 orders, with its settings and replay plan, ended
    when node rank 0 ends its own; its figures handed back after each (``Link.after``). A
    run this node's job failed is handed back as failed: node rank 0 decides what it means
    (a trial's finding, an ablation that could not run)."""
    made: set[Path] = set()
    try:
        _follow(link, argv, run_root, say, max_batches, made)
    finally:
        for folder in made:             # this node's recordings: nothing of them is left
            shutil.rmtree(folder, ignore_errors=True)


def _follow(link: nodes_mod.Link, argv: list[str], run_root: Path, say: Callable[[str], None],
            max_batches: int | None, made: set[Path]) -> None:
    for order in link.follow():
        n = order.run                       # node rank 0's name of the run
        run_dir = run_root / n
        node_dir = link.node_dir(run_dir)
        shutil.rmtree(node_dir, ignore_errors=True)
        say(f"{link.topo.label}: {order.label} (as node rank 0 ordered)")
        try:
            run = run_once(argv, node_dir, order.overrides, max_batches,
                           _local(order, run_root, made), stop=link.stop_rule(order))
        except NoProgress as exc:
            link.after(run_dir, 2, why=f"{link.topo.label}: {exc}")
            continue
        # its job ended on its own (with an error code where the peers node rank 0 stopped
        # first were lost, or 0 where torchrun took that as the job's end): node rank 0's
        # record of this run says whether it was stopped
        stopped = run.stopped or link.stopped_by_leader(order)
        if stopped:
            say(f"{link.topo.label}: {n}: ended by node rank 0: {stopped}")
        link.after(run_dir, exit_status(run.exit_code), stopped=stopped)
