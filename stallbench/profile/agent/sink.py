"""Where a process's records go: the run directory (``Files``), or, in a Ray cluster's worker
on another machine, the job's collector actor (``raysink.Collected``).

Why a sink: the writer and the beats make the same wire records wherever they run; only the
way home differs. A worker on another node has its own temp directory and no path of the
launcher's machine, so its records travel over the engine the job already uses; locally
they are files, atomically replaced, as they always were. Each sink takes a whole record
under its file name (a part is rewritten whole at each flush), so a later put of a name
replaces the earlier one on either side.
"""

from __future__ import annotations

import os

from . import state, wire


class Files:
    """The run directory the launcher named (``Settings.run_dir``)."""

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def where(self) -> str:
        return self.run_dir

    def put(self, name: str, text: str, wait: bool = True, in_place: bool = False) -> None:
        """One record, atomically replaced; raises ``OSError`` where it cannot be written.

        ``in_place``: a small hint rewritten over the file it replaces, padded with spaces to
        its size (no rename, no truncation), for the beats sent every ``BEAT_S`` while
        batches come (issue 60): a rename over an existing file (and a truncation) makes
        ext4 allocate the new blocks at once (``auto_da_alloc``), 0.1-1 ms a write here
        (benchmarks/profile_overhead.py, in a loop); an overwrite costs ~1 us. A reader that meets one
        mid-write gets JSON it cannot parse and skips it (``wire.read_beats``), as a lost
        hint; the beats that must be whole (a process's first with its loaders, its exit's)
        are atomic."""
        path = os.path.join(self.run_dir, name)
        if in_place:
            data = text.encode()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                os.pwrite(fd, data + b" " * (size - len(data)) if size > len(data) else data, 0)
            finally:
                os.close(fd)
            return
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def mark(self, name: str) -> None:
        """An empty file (a full disk still takes one): the ``lost-*`` marker."""
        os.close(os.open(os.path.join(self.run_dir, name), os.O_CREAT | os.O_WRONLY, 0o644))

    def remove(self, name: str) -> None:
        try:
            os.unlink(os.path.join(self.run_dir, name))
        except OSError:
            pass

    def flush_asked(self) -> bool:
        """Whether the launcher left its ``wire.FLUSH_MARK`` (one stat)."""
        return os.path.exists(os.path.join(self.run_dir, wire.FLUSH_MARK))


def current():
    """This process's sink: the one ``install`` chose (``state.SINK``), else the run
    directory's; None where the agent measures nothing."""
    if state.SINK is not None:
        return state.SINK
    run_dir = state.SETTINGS.run_dir
    return Files(run_dir) if run_dir else None
