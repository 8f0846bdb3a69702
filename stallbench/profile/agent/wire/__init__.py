"""The wire: the only contract between the agent (in the job) and the launcher, both ways.

In: the job's settings (``Settings``, in the ``STALLBENCH_PROFILE`` variable) with the replay
plan of an ablation run (``ReplayPlan``). Out: the part files (``Trainer``, ``Epochs``,
``Worker``, ``Replay`` with its ``Mismatch`` / ``Missing`` / ``BudgetStop`` / ``StageServe``),
the beats (``Beat``), ``--live``'s totals and windows (``Live``, ``WindowsPart``, issue
60), a loader's settings (``LoaderSettings``), and the names of the wall's
files (each record's ``file_name``, ``FLUSH_MARK``, ``lost_marker``). Between the launchers
of a multi-node job: how a node's run ended (``NodeRun``) and its files packed for node rank
0 (``pack_node_run`` / ``unpack_node_run``, bounded; ``nodes``), and the run node rank 0 asks
the others for next (``NodeOrder``: a tune's trials).

Why one place: each record is written and read by one class (``to_json`` / ``from_json``,
tolerant as the part records always were), so no module on either side reads a key of
another's dict (``tests/profile/test_wire.py`` fails on a string-key read of wall data
anywhere else), and a field renamed here is renamed for both sides. ``VERSION`` is written
into every file and the settings.

Loaded two ways, so standard library only: in the job as a module of the agent
(``_stallbench_profile_agent.wire``: the agent's Python may be 3.7 and may not have
stallbench installed), and as ``stallbench.profile.agent.wire`` on the launcher side, which
imports nothing else of the agent but the doors' declarations.
"""

from .beats import Beat, read_beats
from .live import LiveSettings, Live, LiveStream, Rest, Windows, WindowsPart, read_live
from .fields import ENV, FLUSH_MARK, LOST_PREFIX, VERSION, lost_marker
from .nodes import NodeOrder, NodeRun, Refused as NodeRunRefused, pack as pack_node_run
from .nodes import unpack as unpack_node_run
from .parts import Epoch, Epochs, Header, Parts, Stages, Stream, Trainer, Worker, parse, read
from .replay import (BudgetStop, Mismatch, Missing, Problem, Replay, ReplayPlan,
                     StageServe)
from .settings import LoaderSettings, Settings

__all__ = ["Beat", "BudgetStop", "Live", "LiveSettings", "LiveStream", "Rest", "Windows",
           "WindowsPart", "read_live", "ENV", "Epoch", "Epochs", "FLUSH_MARK", "Header",
           "LOST_PREFIX", "LoaderSettings", "Mismatch", "Missing", "NodeOrder", "NodeRun",
           "NodeRunRefused", "Parts", "Problem",
           "Replay", "ReplayPlan", "Settings", "StageServe", "Stages", "Stream", "Trainer",
           "VERSION", "Worker", "lost_marker", "pack_node_run", "parse", "read", "read_beats",
           "unpack_node_run"]
