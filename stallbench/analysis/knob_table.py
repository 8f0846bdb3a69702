"""The knobs of a user's job, one table: every ``--set`` key of ``stallbench profile`` and every
key ``stallbench tune -- CMD`` may change, one ``Knob`` row each (issue 55).

Why one table: the six keys were spelled in four places (the ``--set`` parser, its help, the
tune's key lists, ``tune --keys``), the tune kept a loader taxonomy of its own ("torch", "ray",
"other") out of sight of the doors, and the advice a knob ends in ("``DataLoader(...,
num_workers=1)``") was written in three more. A row says everything the launcher side needs of
a knob: its key, the door group that honours it, its values, whether and how the tune searches
it, which field of a loader's recorded settings carries it, and how its advice is written. The
parser (``profile/knobs.py``), the help and ``--keys`` of ``commands/``, the tune's search and
advice (``analysis/loader_search.py``) and the docs' key reference all read it from here; a new
knob is one row, plus its rule in ``loader_search.RULES`` where no rule there fits it.

Why here, in ``analysis/``, and not in ``profile/``: ``analysis.loader_search`` (the tune's
decider, and profile's measured recommendation) reads every field of a row, and ``analysis``
sits below ``profile`` in the layer order (``docs/architecture.md``). Kept in ``profile/``, the
table would have to be handed as an argument to each function of the decider that reads it
(``decide``, ``recommend``, ``not_applied``, ``apply_text``, ``bare``) by every caller. The
table is plain data that imports nothing of the project, so it lives on the lowest layer that
reads it, and ``profile`` and ``commands`` read it from below.

Which loaders a row reaches is never said here, and never by a loader kind's name: a row names
its *group*, one of the groups the doors declare (a door's ``SET_KEYS``), and the door says
whether it honours the group (``doors.of(kind).reaches(group)`` on the launcher side, a
result's ``loaders[].set_keys`` in ``analysis``). ``tests/profile/test_knob_table.py`` checks
that the table's groups are the doors' groups and that no module outside this one spells a key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Advice:
    """How a value of a knob is written where the user applies it in code: the answer of a
    tune (``DataLoader(..., num_workers=1, persistent_workers=True)``) and profile's
    recommendation ("set num_workers=2 on your DataLoader"). Rows with the same ``call`` are
    written as one call, their keywords in the order given."""

    call: str                 # the call the value goes into
    where: str                # what profile's recommendation says to set it on
    keyword: bool = True      # a keyword of ``call`` (``call(..., name=value)``); else its
                              # one argument (``torch.set_num_threads(1)``)
    after: str = ""           # said after the call: when it must be made

    def write(self, args: list[tuple[str, str]]) -> str:
        """``args``: (name, value as written) of the rows of this call."""
        if self.keyword:
            return f"{self.call}(..., " + ", ".join(f"{n}={v}" for n, v in args) + ")" + self.after
        return "; ".join(f"{self.call}({v}){self.after}" for _, v in args)


@dataclass(frozen=True)
class Search:
    """Whether and how ``tune -- CMD`` searches a knob: the evidence that calls for a trial is
    a rule of ``analysis.loader_search`` (``RULES``, named here), and ``step`` is the move it
    makes from the best trial so far, as the docs' key reference says it. ``start`` and
    ``most`` bound a doubled value: doubled from ``start`` where the loader set none (torch's
    ``prefetch_factor`` default is 2, Ray's ``prefetch_batches`` 1), never past ``most``."""

    rule: str
    step: str
    listed: int               # its place in tune's list of keys (``--keys`` help and errors)
    start: int = 0
    most: int = 0


@dataclass(frozen=True)
class Knob:
    """One ``--set``/tune key. Its key is ``group.name``: the hooks receive the values set as
    ``{group: {name: value}}`` (``profile.knobs.Variant.overrides``), and the door that honours
    ``group`` applies ``name`` (torch's DataLoader door passes every ``dataloader`` name as the
    keyword of that name)."""

    group: str                # the door group that honours it (a door's ``SET_KEYS``)
    name: str                 # the argument it overrides
    type: type                # int or bool
    lo: int                   # an int's range (bool: 0..1)
    hi: int
    reaches: str              # what it reaches, for the docs' reference
    advice: Advice
    recorded: str | None = None   # the field of a loader's recorded settings that carries it
                                  # (``loaders[].settings``); None: no loader records it
    search: Search | None = None  # None: only ``profile --set`` tries it
    process: bool = False     # a setting of the trainer's process, not of a loader: whatever
                              # loader the job has, it reaches the job
    note: str = ""            # said after the key in ``profile --set``'s help

    @property
    def key(self) -> str:
        return f"{self.group}.{self.name}"


DATALOADER = Advice(call="DataLoader", where="DataLoader")
RAY_ITERATOR = Advice(call="iter_torch_batches", where="Ray Data's iterator")
TORCH_THREADS = Advice(call="torch.set_num_threads", keyword=False,
                       where="trainer (torch.set_num_threads before its first op)",
                       after=" before the first op (or OMP_NUM_THREADS)")
EVERY_DATALOADER = "every DataLoader the job creates"
MAX_DOUBLED = 16              # a doubled queue depth the tune tries at most

WORKERS = Knob("dataloader", "num_workers", int, 0, 1024, EVERY_DATALOADER, DATALOADER,
               recorded="num_workers",
               search=Search("workers_knee", "the producer model's knee, within the machine's "
                             "cores, where the loop waits", 1))
PIN_MEMORY = Knob("dataloader", "pin_memory", bool, 0, 1, EVERY_DATALOADER, DATALOADER,
                  recorded="pin_memory",
                  search=Search("cuda_copy", "false -> true, where the loop waits and its batches "
                                "reach a CUDA device", 4))
PREFETCH_FACTOR = Knob("dataloader", "prefetch_factor", int, 1, 1024, EVERY_DATALOADER,
                       DATALOADER, recorded="prefetch_factor",
                       search=Search("bursts", "where the steady waits come in bursts: doubled", 3,
                                     start=2, most=MAX_DOUBLED))
PERSISTENT_WORKERS = Knob("dataloader", "persistent_workers", bool, 0, 1, EVERY_DATALOADER,
                          DATALOADER, recorded="persistent_workers",
                          search=Search("startup", "false -> true, where each epoch forks the "
                                        "workers again and that start-up weighs", 2))
RAY_PREFETCH = Knob("ray", "prefetch_batches", int, 0, 1024, "Ray Data's iterators",
                    RAY_ITERATOR, recorded="prefetch_batches",
                    search=Search("waiting", "while the loop waits and a doubling pays: "
                                  "doubled", 6, start=1, most=MAX_DOUBLED))
THREADS = Knob("torch", "num_threads", int, 1, 1024,
               "the trainer's intra-op threads, set when the job imports torch, before its "
               "first op", TORCH_THREADS, process=True, note="the trainer's intra-op threads",
               search=Search("thread_storm", "cores - workers, where the step computed on "
                              "the CPU slowed beside the workers (a thread storm)", 5))

# the order of ``profile --set``'s help and errors
TABLE: tuple[Knob, ...] = (WORKERS, PIN_MEMORY, PREFETCH_FACTOR, PERSISTENT_WORKERS,
                           RAY_PREFETCH, THREADS)


def rows() -> tuple[Knob, ...]:
    """The table as it is now (read at each call: a test may add a row)."""
    return TABLE


def by_key(key: str) -> Knob | None:
    return next((k for k in TABLE if k.key == key), None)


def keys() -> list[str]:
    return [k.key for k in TABLE]


def group_of(key: str) -> str:
    """The door group of a dotted key (its first part, as the hooks receive it)."""
    return key.split(".", 1)[0]


def listed(knobs: list[Knob] | tuple[Knob, ...] | None = None, notes: bool = True) -> str:
    """The keys as a help string lists them: ``a.b, c.d (its note)``."""
    return ", ".join(k.key + (f" ({k.note})" if notes and k.note else "")
                     for k in (TABLE if knobs is None else knobs))


def searched() -> list[Knob]:
    """The knobs the tune searches, in the order it lists them."""
    return sorted((k for k in TABLE if k.search is not None), key=lambda k: k.search.listed)


def searched_for(groups: frozenset[str] | tuple[str, ...]) -> list[Knob]:
    """The knobs the tune searches on a loader whose door honours ``groups``: the rows of
    those groups; where the door honours no group (a ``stallbench.watch``ed iterable, a
    thread's queue), the trainer's own (``process``) rows, the only ones left that reach the
    job. (A Ray Data loop is searched by its own group alone, as before this table.)"""
    mine = [k for k in searched() if k.group in groups]
    return mine if mine or reaches_a_loader(groups) else [k for k in searched() if k.process]


def reaches_a_loader(groups: frozenset[str] | tuple[str, ...]) -> bool:
    """Whether any loader knob (not the process's) belongs to one of ``groups``."""
    return any(k.group in groups and not k.process for k in TABLE)


def bare_name(key: str) -> str:
    """A key as a trial's recorded ``settings`` names it: a loader's keyword bare
    (``num_workers``), a process's setting with its group (``torch.num_threads``)."""
    k = by_key(key)
    return k.name if k is not None and not k.process else key


def dotted_key(name: str, groups: frozenset[str] | tuple[str, ...]) -> str:
    """``bare_name``'s inverse for a loader honouring ``groups``."""
    if "." in name:
        return name
    loader = [k for k in TABLE if k.name == name and not k.process]
    k = next((k for k in loader if k.group in groups), loader[0] if loader else None)
    return k.key if k is not None else name


def advice_text(settings: dict[str, Any]) -> str:
    """Dotted settings as the user writes them in code, one call per ``Advice.call`` in the
    table's order, each call's arguments in the order given ("" for none in the table)."""
    calls: dict[str, tuple[Advice, list[tuple[str, str]]]] = {}
    for k in TABLE:
        calls.setdefault(k.advice.call, (k.advice, []))
    for key, v in settings.items():
        k = by_key(key)
        if k is not None:
            calls[k.advice.call][1].append((k.name, repr(v) if k.advice.keyword else str(v)))
    return "; ".join(a.write(args) for a, args in calls.values() if args)


def where(keys_set: list[str]) -> str:
    """What profile's recommendation says to set these keys on: their one place, else the
    first row's (the DataLoader, as before this table)."""
    places = {k.advice.where for k in map(by_key, keys_set) if k is not None}
    return places.pop() if len(places) == 1 else TABLE[0].advice.where


def values_text(k: Knob) -> str:
    return "true or false" if k.type is bool else f"an integer {k.lo}..{k.hi}"
