"""The core's interface: exactly the names a door may use, in one object (``CORE``).

Why declared: a door patches a library the agent does not control, and it is the part that
grows (one module per loader kind). Before this interface a door reached any name of the
core's module, 9 of them mutable globals, so no change of the core was safe without reading
every door. Now a door gets this object (``doors._base.bind`` sets it as the door's ``H``)
and reaches nothing else of the agent: ``tests/profile/test_doors.py`` checks that every
``H.<name>`` a door uses is a member here, and that a door imports nothing of the agent but
``doors._base``.

Mutable state (the settings sent in, the replay of an ablation run, which loader a process
serves, the tracked loaders, the thread's active stream) is read through properties: each
read finds the state as it is now (a fork or an install rebinds it), never a copy.
"""

from __future__ import annotations

from . import beats, frames, passes, stages, state, streams, util, writer


class Core:
    """What a door may use of the core (``H`` in a door module)."""

    __slots__ = ()      # nothing can be set on it: a door reads, the core's modules write

    # what a door makes: a loader's stream, a wrapped iterable's passes, an object table
    Stream = streams.Stream
    Passes = passes.Passes
    IdMap = state.IdMap
    # clocks: wall, and the calling thread's CPU
    perf = staticmethod(state.perf)
    tcpu = staticmethod(state.tcpu)
    # the rules every door keeps
    own = staticmethod(util.own)
    unmeasured = staticmethod(util.unmeasured)
    say = staticmethod(util.say)
    own_process = staticmethod(state.own_process)
    without_agent = staticmethod(frames.without_agent)     # a traceback the job will print
    # passes and batches
    loader_stream = staticmethod(passes.loader_stream)
    begin_pass = staticmethod(passes.begin_pass)
    hook_passes = staticmethod(passes.hook_passes)
    tagged_next = staticmethod(passes.tagged_next)
    count_batch = staticmethod(beats.count_batch)
    own_iter = staticmethod(beats.own_iter)
    has_streams = staticmethod(streams.has_streams)
    forget_streams = staticmethod(streams.forget_streams)
    # stage records and writing them
    stage_add = staticmethod(stages.stage_add)
    stages_add = staticmethod(stages.stages_add)
    flush = staticmethod(writer.flush)
    flush_worker = staticmethod(writer.flush_worker)
    # the environment a loader's spawned workers read (which loader, which epoch)
    LOADER_ENV = state.LOADER_ENV
    EPOCH_ENV = state.EPOCH_ENV

    @property
    def settings(self):
        """The settings the launcher sent in (``--set`` overrides among them)."""
        return state.SETTINGS

    @property
    def replay(self):
        """The replay of an ablation run (``replay``), None in a plain profile."""
        return state.REPLAY

    @property
    def proc(self):
        """Which loader this process serves (``serving``, ``worker_loader``,
        ``serving_epoch``): the DataLoader door sets them as its workers start."""
        return state.PROC

    @property
    def active(self):
        """This thread's fetch: ``stream`` (the stream whose batch it makes), ``pin_key``,
        ``produced`` / ``asking`` (a queue's feed)."""
        return state.ACTIVE

    @property
    def loaders(self):
        """Loader object -> its stream (``IdMap``: nothing stored in the loader)."""
        return state.LOADERS


MEMBERS = frozenset(n for n in vars(Core) if not n.startswith("_"))
CORE = Core()
