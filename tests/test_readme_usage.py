"""The README's "Using it" block is run verbatim, as a new user pastes it (issue 14).

Each command line of the block's first ``sh`` fence runs with bash in a fresh directory that
holds only a copy of ``scenarios/`` (a new user's checkout has nothing else that the commands
read: no results, no report), with ``stallbench`` on PATH. Every line must exit 0, in order:
later lines read what earlier ones wrote (the report reads ``results/``, the gate compares two
runs). Comments after ``#`` are the README's explanations, not part of the command.

Both demo runs must also tell the story the README's "What the demo shows" tells (the bound of
each variant and the fix the first one's verdict names): the README prints no figure, so the
story is what a test holds it to.

It runs the demo scenario twice (the gate needs a baseline and a current run), so it is marked
``e2e``. A demo run's time is its EMULATED waits (storage and the step leave the CPU free), so
the second ``stallbench run`` line starts as soon as the first has opened its dataset (its first
``variant`` line: every dataset of the scenario is generated and opened before it) instead of
after the first has exited: the second still reads the dataset cache the first one generated,
as on a fresh checkout, both are the README's demo at full size, and the test costs about one
demo run instead of two. Every other line starts after the lines before it have exited.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def using_it_commands(readme: str) -> list[str]:
    """The command lines of the first ``sh`` block under "## Using it"."""
    section = readme.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block, "README: no ```sh block under '## Using it'"
    lines = []
    for raw in block.group(1).splitlines():
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if line:
            lines.append(line)
    return lines


def test_the_block_is_found_and_uses_the_public_commands() -> None:
    cmds = using_it_commands((ROOT / "README.md").read_text())
    verbs = {c.split()[1] for c in cmds if c.startswith("stallbench ")}
    assert {"run", "report", "whatif", "gate"} <= verbs, cmds


def _is_run(cmd: str) -> bool:
    return cmd.startswith("stallbench run ")


class _Line:
    """One command line of the block in bash, its output in unnamed temp files (not pipes:
    a line nobody waits for yet must never block on a full pipe)."""

    def __init__(self, cmd: str, cwd: Path, env: dict[str, str]) -> None:
        self.cmd = cmd
        self.out, self.err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, env=env, text=True,
                                     stdout=self.out, stderr=self.err)

    def stdout(self) -> str:
        self.out.seek(0)
        return self.out.read()

    def wait_for_variant(self, timeout: float = 600) -> None:
        """Until the run has said its first ``variant`` line (every dataset of the scenario
        is then generated and opened), or it has exited."""
        deadline = time.monotonic() + timeout
        while (time.monotonic() < deadline and self.proc.poll() is None
               and "\n  variant " not in self.stdout()):
            time.sleep(0.1)

    def finish(self, timeout: float = 600) -> None:
        """Exit 0 and no traceback, or the line, its exit status and its output's tails."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.stop()
        self.err.seek(0)
        out, err = self.stdout(), self.err.read()
        assert self.proc.returncode == 0, (self.cmd, self.proc.returncode, out[-2000:],
                                           err[-2000:])
        assert "Traceback" not in err, (self.cmd, err[-2000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.e2e
def test_every_using_it_command_exits_0_on_a_fresh_checkout(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("STALLBENCH_CACHE", str(tmp_path / ".cache"))
    cmds = using_it_commands((ROOT / "README.md").read_text())
    running: list[_Line] = []
    try:
        for cmd, before in zip(cmds, [None, *cmds]):
            if not (_is_run(cmd) and before is not None and _is_run(before)):
                while running:                 # in order: this line reads what they write
                    running.pop(0).finish()
            running.append(_Line(cmd, tmp_path, env))
            if _is_run(cmd):
                running[-1].wait_for_variant()
                if running[-1].proc.poll() is not None:   # ended already: said now, in order
                    while running:
                        running.pop(0).finish()
        while running:
            running.pop(0).finish()
    finally:
        for line in running:                   # a failed line leaves no other one running
            line.stop()
    assert (tmp_path / "report" / "index.html").stat().st_size > 10_000
    # The story "What the demo shows" tells, read off the two runs the block made: no worker is
    # fetch-bound and its verdict's fix is loader workers; two workers are compute-bound.
    made = [*(tmp_path / "baseline").glob("demo-*.json"), *(tmp_path / "results").glob("demo-*.json")]
    assert len(made) == 2, made
    for result in made:
        variants = {v["name"]: v for v in json.loads(result.read_text())["variants"]}
        none, two = variants["num_workers=0"], variants["num_workers=2"]
        assert none["recommendation"]["bound_by"] == "fetch", (result.name, none["recommendation"])
        assert none["recommendation"]["knob"] == "loader.num_workers", none["recommendation"]
        assert two["recommendation"]["bound_by"] == "compute", (result.name, two["recommendation"])
