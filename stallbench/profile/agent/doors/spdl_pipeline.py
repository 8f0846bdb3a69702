"""Door: a Meta SPDL pipeline (``spdl.pipeline.Pipeline``: thread-based, no DataLoader).

An SPDL job builds ``PipelineBuilder().add_source(...).pipe(...).aggregate(...).add_sink(...)
.build(num_threads=...)`` and its loop takes the items the pipeline's background event loop
put into the sink: ``for batch in pipeline.get_iterator(timeout=...)`` (or ``for batch in
pipeline``, which calls it), or ``pipeline.get_item()`` itself. The exposed stall is the
loop's time in those calls, so they are what is hooked:

- ``Pipeline.get_iterator`` starts a pass (one per call: SPDL's iterator covers one epoch and
  stays exhausted); the ``PipelineIterator`` it returns is tagged in the core's ``ITERS`` and
  its hooked ``__next__`` runs each batch through the stream's clocks (the first batch waits
  from ``get_iterator()``: a pipeline not started yet starts in its first ``get_item``).
- ``Pipeline.get_item`` called by the loop itself (not by the iterator above) is a pass of
  its own from its first call to the ``EOFError`` that ends an epoch: a step-based loop
  (``for step in range(n): pipeline.get_item()``) is measured too.
- a pipeline SPDL iterates itself (the nested pipelines of a ``.to()`` region's workers or a
  priority executor, called from ``spdl/pipeline/``) is no loader of the job: not counted.

One stream per ``Pipeline`` object, named by its first ``pipe`` stage (the user's loading
function: ``load_image#0``), else its source's type, else ``Pipeline``; the name is read from
the config the pipeline was built from (``_build_pipeline`` hooked: both
``PipelineBuilder.build`` and ``build_pipeline`` reach it). Samples are counted from each
batch's structure (the core's rule), a list being the samples ``aggregate(n)`` put in it
(``LISTS_ARE_SAMPLES``: 8 images of 16 rows are 8 samples, not 16). SPDL's stage functions
run in its event loop's thread pool: they are not timed as stages (only ``stallbench.stage``
marks there are), and no ``--set`` key reaches the pipeline (``num_threads`` and per-stage
``concurrency`` are the job's own code).
"""

from __future__ import annotations

import os
import sys
import threading
import types

from ._base import H   # the core's interface, set by the agent's loader (``_base.bind``)

KINDS = ("spdl.Pipeline",)
PATCHES = {"spdl.pipeline._pipeline": "patch_pipeline", "spdl.pipeline._build": "patch_build"}
SET_KEYS: tuple = ()
SERVED = ""
STAGES = ""     # SPDL's stage threads are not timed: only stallbench.stage marks are recorded
PASS_PER_CALL = True    # a pipeline built each epoch (spdl.dataloader.DataLoader does): a
                        # stream per epoch, joined by the tune; a continuous one is one stream
WRITTEN_FOR = ("spdl", "0.8", "Pipeline.get_iterator/get_item, PipelineIterator.__next__ and "
               "_build._build_pipeline")
VERSION_FROM = ("spdl-core", "spdl")    # spdl is a meta-package of spdl-core and spdl-io
KIND = KINDS[0]
# a batch that is a list is the list of samples ``aggregate(n)`` made (never columns: SPDL
# has no collate of its own that returns them)
LISTS_ARE_SAMPLES = True

_BUILT = None                   # a Pipeline -> (label, settings) from the config it was built of
_DIRECT = None                  # a Pipeline -> its open pass of the loop's own get_item calls
_INSIDE = threading.local()     # on while a hooked PipelineIterator.__next__ runs: its get_item
_WHERE = types.SimpleNamespace(file="", dir="")    # spdl/pipeline/_pipeline.py, its folder


def bound() -> None:
    global _BUILT, _DIRECT
    _BUILT = H.IdMap()
    _DIRECT = H.IdMap()


def at_fork() -> None:
    """In a forked child: the parent's pipelines are not this process's."""
    _BUILT.clear()
    _DIRECT.clear()


def _describe(cfg, kwargs: dict) -> tuple[str, dict]:
    """The stream's label and settings from a ``PipelineConfig`` (its dataclass fields, read
    from its ``__dict__``): the first ``pipe`` stage's name, else the source's type."""
    src = H.own(cfg, "src")
    source = H.own(src, "source") if src is not None else None
    names, label, batch = [], "", None
    for p in list(H.own(cfg, "pipes") or ())[:16]:
        name = H.own(p, "name")
        if type(name) is str:
            names.append(name)
            if not label and type(p).__name__ == "PipeConfig":
                label = name
        op = H.own(p, "op")
        n = H.own(op, "n") if op is not None and type(op).__name__ == "Collate" else None
        if batch is None and type(n) is int and n > 0:
            batch = n
    if not label:
        label = type(source).__name__ if source is not None else "Pipeline"
    threads = kwargs.get("num_threads")
    settings = {"num_threads": threads if type(threads) is int else None,
                "stages": names[:8],
                "source": type(source).__name__ if source is not None else None,
                "batch_size": batch}
    return label, settings


def patch_build(mod) -> None:
    """``_build._build_pipeline`` (what ``PipelineBuilder.build`` and ``build_pipeline`` call,
    looked up in the module at each call): the pipeline it returns is remembered with the name
    and settings of its config, for the stream made at its first pass."""
    import functools
    orig = mod._build_pipeline

    @functools.wraps(orig)
    def _build_pipeline(pipeline_cfg, *a, **k):
        p = orig(pipeline_cfg, *a, **k)
        try:
            _BUILT.set(p, _describe(pipeline_cfg, k))
        except Exception:  # noqa: BLE001 - the stream is then named "Pipeline"
            pass
        return p

    mod._build_pipeline = _build_pipeline


def _stream(p):
    """The pipeline's stream, made at its first pass (None, said once, where it cannot be)."""
    st = H.loaders.get(p)
    if st is not None:
        return st
    try:
        label, settings = _BUILT.get(p) or ("Pipeline", {})
        st = H.Stream(KIND, label, settings)
        if not H.loaders.set(p, st):
            st.switch_off("it cannot be tracked without storing into it")
        return st
    except Exception:  # noqa: BLE001 - the pipeline runs unmeasured, said once
        H.unmeasured(KIND, "its stream could not be made")
        return None


def _by_spdl() -> bool:
    """Whether the caller of the hooked method (past ``_pipeline.py``'s own frames:
    ``Pipeline.__iter__`` calls ``get_iterator``) is SPDL's pipeline package itself: a nested
    pipeline a worker or a priority executor iterates, not the job's loop."""
    try:
        f = sys._getframe(2)
        while f is not None and f.f_code.co_filename == _WHERE.file:
            f = f.f_back
        return f is not None and bool(_WHERE.dir) and \
            f.f_code.co_filename.startswith(_WHERE.dir)
    except Exception:  # noqa: BLE001 - no frame to read: taken as the job's loop
        return False


def patch_pipeline(mod) -> None:
    """``Pipeline.get_iterator`` (passes), ``PipelineIterator.__next__`` (the wait) and
    ``Pipeline.get_item`` called by the loop itself (a pass until ``EOFError``)."""
    import functools
    _WHERE.file = os.path.abspath(mod.__file__)
    _WHERE.dir = os.path.dirname(_WHERE.file) + os.sep
    Pipeline, PipelineIterator = mod.Pipeline, mod.PipelineIterator
    orig_get_iterator = Pipeline.__dict__["get_iterator"]
    orig_get_item = Pipeline.__dict__["get_item"]
    orig_next = PipelineIterator.__dict__["__next__"]
    tagged = H.tagged_next(orig_next)

    @functools.wraps(orig_get_iterator)
    def get_iterator(self, *a, **k):
        if _by_spdl():
            return orig_get_iterator(self, *a, **k)
        return H.begin_pass(_stream(self), lambda p: orig_get_iterator(p, *a, **k), self,
                            "spdl.Pipeline.get_iterator")

    @functools.wraps(orig_next)
    def __next__(self):
        prev = getattr(_INSIDE, "on", False)
        _INSIDE.on = True           # its get_item is this batch's, not a pass of its own
        try:
            return tagged(self)
        finally:
            _INSIDE.on = prev

    @functools.wraps(orig_get_item)
    def get_item(self, *a, **k):
        if getattr(_INSIDE, "on", False) or _by_spdl():
            return orig_get_item(self, *a, **k)
        return _direct(self, orig_get_item, a, k)

    Pipeline.get_iterator = get_iterator
    PipelineIterator.__next__ = __next__
    Pipeline.get_item = get_item


def _direct(p, orig, a, k):
    """One ``get_item`` of the loop's own through the stream's clocks: a pass starts at the
    first call after the previous pass ended (an ``EOFError``: SPDL's end of an epoch, raised
    to the job as it is), and its first wait is that call's. ``--max-batches`` ends the pass
    in the figures only: a ``get_item`` loop's end is an ``EOFError`` a step loop would not
    expect, so the rest of the epoch is served to it unmeasured."""
    st = _stream(p)
    if st is None or st.unmeasured:
        return orig(p, *a, **k)
    try:
        ep = _DIRECT.get(p)
        if ep is None or ep.abandoned or (ep.t_end is not None and not ep.capped):
            ep = st.new_epoch(H.perf())
            if not _DIRECT.set(p, ep):
                st.switch_off("its get_item passes cannot be tracked")
    except Exception:  # noqa: BLE001
        st.switch_off("its get_item passes could not be timed")
    if st.unmeasured:
        return orig(p, *a, **k)
    eof: list = []

    def source(_):
        try:
            return orig(p, *a, **k)
        except EOFError as exc:     # the epoch's end: the core ends the pass on StopIteration
            eof.append(exc)
            raise StopIteration from None

    try:
        return st.next_batch(ep, source, None)
    except StopIteration:
        pass
    if eof:                         # raised outside the handler: the job's exception as it was
        _DIRECT.set(p, None)
        raise eof[0]
    if not ep.capped:               # a compute-only run's replay ended the epoch where the
        _DIRECT.set(p, None)        # full run's ended: SPDL's own end of an epoch
        raise EOFError("the epoch ended where the profiled run's did (compute-only replay)")
    ep.past_cap = True              # --max-batches reached (the core ended the pass)
    try:
        return orig(p, *a, **k)
    except EOFError:
        _DIRECT.set(p, None)
        raise
