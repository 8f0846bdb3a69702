"""The recording budget of ``profile --analyze``: how many bytes of a job's outputs one of its
processes may keep (the compute-only run's kept batches, the recording run's items and
batches), from the machine's free memory rather than a fixed figure (issue 39).

A fixed 512 MB filled with 640 images of 224 px on a machine with tens of GB free, and would
be too much on a small one. The served runs read a process's record back into memory, and
every loader worker records at once, so the budget per process is

    budget = SHARE x available / processes,   clamped to [FLOOR_MB, CEIL_MB]

with ``available`` the memory the kernel can give without swapping (``MemAvailable`` of
``/proc/meminfo``, psutil's ``virtual_memory().available`` elsewhere) when the analysis
starts, and ``processes`` the headline loader's workers (at least 1). The figure and how it
was reached are stated in the output and stored (``ProfileAnalysis.budget_mb`` and
``budget_basis``). Runs on the launcher's side only (psutil is allowed here)."""

from __future__ import annotations

from dataclasses import dataclass

SHARE = 0.25          # of the available memory, for all the recording processes together
FLOOR_MB = 64.0       # below this nothing useful is recorded; the run says the budget ran out
CEIL_MB = 16384.0     # a record this large takes longer to write than the ablations save
MB = 1024 * 1024


@dataclass(frozen=True)
class Budget:
    mb: float             # per process
    basis: str            # in words: the figure it came from


def available_bytes() -> tuple[int | None, str]:
    """(bytes the machine can give without swapping, where the figure comes from);
    (None, why) where neither source answers."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "/proc/meminfo MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available), "psutil virtual_memory().available"
    except Exception as exc:  # noqa: BLE001 - no figure: the caller says so
        return None, f"available memory unknown ({type(exc).__name__})"


def recording_budget(available: int | None, processes: int = 1, source: str = "") -> Budget:
    """The budget per process from ``available`` bytes shared by ``processes`` recording
    processes (the module docstring's rule); ``source`` names where ``available`` came from."""
    procs = max(int(processes), 1)
    if available is None or available <= 0:
        return Budget(FLOOR_MB, f"{FLOOR_MB:g} MB per process, the floor: "
                                f"{source or 'available memory unknown'}")
    raw = SHARE * available / MB / procs
    mb = float(round(min(max(raw, FLOOR_MB), CEIL_MB)))
    clamp = (f", raised to the {FLOOR_MB:g} MB floor" if raw < FLOOR_MB else
             f", capped at {CEIL_MB:g} MB" if raw > CEIL_MB else "")
    each = f" / {procs} processes (the loader's workers)" if procs > 1 else ""
    return Budget(mb, f"{mb:,.0f} MB per process: {SHARE:.0%} of {available / MB:,.0f} MB "
                      f"available ({source or 'measured'}){each}{clamp}")


def machine_budget(processes: int = 1) -> Budget:
    """``recording_budget`` of this machine now."""
    avail, source = available_bytes()
    return recording_budget(avail, processes, source)
