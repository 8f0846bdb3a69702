"""How many samples a batch holds, from its structure alone: one rule for every door
(DataLoader, Ray, ``watch``, a queue fed by a loader thread, torchdata, SPDL).

Why apart: it is the one place that looks inside the job's batches, so its rule (no code of
the batch's classes runs from here) is kept in one short file.
"""

from __future__ import annotations

import types


def rows(batch, default: int, listed: bool = False) -> int:
    """Samples in a batch, from its structure, one rule for every door (DataLoader, Ray,
    ``watch``, a queue fed by a loader thread, torchdata, SPDL): the leading dimension of a
    tensor/array; the length of a sequence of values (``[path, path, ...]``, a list of
    ints); a mapping counts by its first value that holds something: a tensor's leading
    dimension, a list's or tuple's length (each value of a mapping is a column: a tokenizer's
    ``{"input_ids": [[...], [...]]}`` holds 2 rows, not one of the first row's length), a
    nested mapping's count. Dict-likes that keep their mapping in ``data`` (``UserDict``,
    Hugging Face's ``BatchEncoding``) count as that mapping (issue 57: a ``BatchEncoding``
    of 2 rows was counted as 1 sample). A tuple/list of columns counts by its first column.
    A list whose items are dicts or tuples (its first and last read) is the list of the
    samples (an identity ``collate_fn``; torch's default collate turns dict samples into one
    dict and tuple samples into a list of columns): its length. ``listed``: the door says a
    list is always its samples (SPDL's ``aggregate(n)`` yields the n samples, whatever they
    are: 8 images of 16 rows each were counted as 16 samples). Nothing countable (a scalar,
    a string, an object): the loader's batch size.
    Only the builtin containers' own methods, C-level ``shape`` descriptors (torch, numpy)
    and the instance ``__dict__`` of a ``UserDict`` are used: a batch class's
    ``__getattr__`` (a lookup that raises ``KeyError``), properties or overridden
    ``values()`` never run from here."""
    try:
        if listed and issubclass(type(batch), list):
            return list.__len__(batch)
        n = _count(batch, 4)
        if n is not None:
            return n
    except Exception:  # noqa: BLE001 - an odd batch is counted as a batch_size one
        pass
    return default


def _mapping(b) -> dict | None:
    """The dict a batch keeps its columns in: itself (a dict), or a ``UserDict``'s ``data``
    read from its instance ``__dict__`` (no attribute lookup of its class runs)."""
    if issubclass(type(b), dict):
        return b
    if any(k.__name__ == "UserDict" and k.__module__ == "collections"
           for k in type(b).__mro__):
        d = object.__getattribute__(b, "__dict__").get("data")
        return d if issubclass(type(d), dict) else None
    return None


def _column(v, depth: int) -> int | None:
    """Rows of one value of a mapping (a column): a tensor's leading dimension, a sequence's
    length, a nested mapping's count."""
    shape = _shape(v)
    if shape is not None:
        return int(tuple.__getitem__(shape, 0)) if tuple.__len__(shape) > 0 else None
    t = type(v)
    if issubclass(t, (list, tuple)):
        n = (list if issubclass(t, list) else tuple).__len__(v)
        return n or None
    return _count(v, depth - 1) if _mapping(v) is not None else None


def _count(b, depth: int) -> int | None:
    """``rows`` of one value; None where it holds nothing countable."""
    t = type(b)
    shape = _shape(b)
    if shape is not None:
        return int(tuple.__getitem__(shape, 0)) if tuple.__len__(shape) > 0 else None
    if depth <= 0:
        return None
    m = _mapping(b)
    if m is not None:
        for i, v in enumerate(dict.values(m)):
            if i >= 8:
                break
            n = _column(v, depth)
            if n is not None:
                return n
        return None
    if issubclass(t, (list, tuple)):
        seq = list if issubclass(t, list) else tuple
        size = seq.__len__(b)
        if not size:
            return None
        first, last = seq.__getitem__(b, 0), seq.__getitem__(b, -1)
        if seq is list and (all(_mapping(x) is not None for x in (first, last))
                            or all(type(x) is tuple for x in (first, last))):
            return size             # a list of samples (identity collate)
        if _shape(first) is not None or issubclass(type(first), (list, tuple)) \
                or _mapping(first) is not None:
            return _count(first, depth - 1)     # columns: the first one's length
        return size                 # a column of plain values (paths, ids)
    return None


_SAMPLED = 16      # children of a container read for ``elements`` (the rest scaled from them)


def elements(batch) -> int:
    """The values a batch holds: every tensor's or array's shape product, a list's numbers
    counted one each; containers (dicts, ``UserDict``s, lists, tuples) looked into, at most
    ``_SAMPLED`` children of each read and the rest scaled from them. The batch's size for
    the step's cost (issue 57): variable-length batches (dynamic padding) hold as many rows
    but not as many tokens, and a compute-only run that served its few kept batches again
    measured their step, not the job's (53.8 s of "interference" on the transformers
    tutorial). Same rules as ``rows``: no code of a batch's class runs. 0 where nothing is
    countable."""
    try:
        return int(_elements(batch, 4))
    except Exception:  # noqa: BLE001 - an odd batch has no size: not scaled
        return 0


def _elements(b, depth: int) -> float:
    shape = _shape(b)
    if shape is not None:
        n = 1
        for d in tuple.__iter__(shape):
            n *= int(d)
        return n
    t = type(b)
    if t in (int, float, bool):
        return 1
    if depth <= 0:
        return 0
    m = _mapping(b)
    if m is not None:
        return sum(_elements(v, depth - 1) for v in dict.values(m))
    if issubclass(t, (list, tuple)):
        seq = list if issubclass(t, list) else tuple
        size = seq.__len__(b)
        if not size:
            return 0
        read = [seq.__getitem__(b, i) for i in range(min(size, _SAMPLED))]
        return sum(_elements(v, depth - 1) for v in read) * size / len(read)
    return 0


_C_DESCRIPTORS = (types.GetSetDescriptorType, types.MemberDescriptorType)
_NONE = object()
_DESC: dict = {}        # id(type) -> (type, its C ``shape`` descriptor or _NONE): per batch
                        # the MRO walk cost a microsecond (issue 60); keyed by id, the type
                        # kept beside it, so no ``__hash__`` of a metaclass runs


def _shape(b) -> tuple | None:
    """``b.shape`` where the type defines it in C (a tensor's or an array's), as a tuple;
    None for anything else (no Python code of the batch's class runs)."""
    t = type(b)
    hit = _DESC.get(id(t))
    if hit is not None and hit[0] is t:
        desc = hit[1]
    else:
        desc = _descriptor(t)
        if len(_DESC) >= 256:
            _DESC.clear()
        _DESC[id(t)] = (t, desc)
    if desc is _NONE:
        return None
    shape = desc.__get__(b, t)
    return shape if issubclass(type(shape), tuple) else None


def _descriptor(t: type):
    """The C descriptor of ``shape`` the first class of ``t``'s MRO that has one defines;
    ``_NONE`` where it is not a C descriptor or none defines it."""
    for klass in t.__mro__:
        desc = klass.__dict__.get("shape")
        if desc is not None:
            return desc if type(desc) in _C_DESCRIPTORS else _NONE
    return _NONE
