"""How many samples a batch holds, from its structure alone: one rule for every door
(DataLoader, Ray, ``watch``, a queue fed by a loader thread, torchdata, SPDL).

Why apart: it is the one place that looks inside the job's batches, so its rule (no code of
the batch's classes runs from here) is kept in one short file.
"""

from __future__ import annotations

import types


def rows(batch, default: int) -> int:
    """Samples in a batch, from its structure, one rule for every door (DataLoader, Ray,
    ``watch``, a queue fed by a loader thread, torchdata): the leading dimension of a
    tensor/array; the length of a sequence of values (``[path, path, ...]``, a list of
    ints); a dict counts by its first value that is a tensor or a sequence (a batch
    ``{"path": [...], "image": tensor}`` by its paths, not as one sample); a tuple/list of
    columns by its first column. A list whose items are dicts or tuples (its first and last
    read) is the list of the samples (an identity ``collate_fn``; torch's default collate
    turns dict samples into one dict and tuple samples into a list of columns): its length.
    Nothing countable (a scalar, a string, an object): the loader's batch size.
    Only the builtin containers' own methods and C-level ``shape`` descriptors (torch,
    numpy) are used: a batch class's ``__getattr__`` (a lookup that raises ``KeyError``),
    properties or overridden ``values()`` never run from here."""
    try:
        n = _count(batch, 4)
        if n is not None:
            return n
    except Exception:  # noqa: BLE001 - an odd batch is counted as a batch_size one
        pass
    return default


def _count(b, depth: int) -> int | None:
    """``rows`` of one value; None where it holds nothing countable."""
    t = type(b)
    shape = _shape(b)
    if shape is not None:
        return int(tuple.__getitem__(shape, 0)) if tuple.__len__(shape) > 0 else None
    if depth <= 0:
        return None
    if issubclass(t, dict):
        for i, v in enumerate(dict.values(b)):
            if i >= 8:
                break
            n = _count(v, depth - 1)
            if n is not None:
                return n
        return None
    if issubclass(t, (list, tuple)):
        seq = list if issubclass(t, list) else tuple
        size = seq.__len__(b)
        if not size:
            return None
        first, last = seq.__getitem__(b, 0), seq.__getitem__(b, -1)
        if seq is list and (all(issubclass(type(x), dict) for x in (first, last))
                            or all(type(x) is tuple for x in (first, last))):
            return size             # a list of samples (identity collate)
        if _shape(first) is not None or issubclass(type(first), (list, tuple, dict)):
            return _count(first, depth - 1)     # columns: the first one's length
        return size                 # a column of plain values (paths, ids)
    return None


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
