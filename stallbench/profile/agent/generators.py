"""The job's global random generators (torch's, numpy's legacy ``np.random``, Python's
``random``): their state taken after a recorded fetch call and set again after the same call
is served (issue 57).

Why: serving a fetch call from the recording skips what the call drew (a ``torch.rand`` or a
``RandomResizedCrop`` in ``__getitem__``, a random mask in ``collate_fn``). Left alone, the
served run's global generators stand elsewhere than the recorded run's after the first
served call, and the next epoch's ``RandomSampler`` (seeded from torch's global generator)
asks for other items: the ablation was void on any job with random augmentation and more than
one epoch. Set to the recorded state after each served call, the served run's generators
advance exactly as the recorded run's did, whatever the call drew.

Only generators of modules the job imported are read (``sys.modules``: the agent imports
neither torch nor numpy), and a state is kept only where the call moved it, so a job whose
data path draws nothing records nothing. Generators the job made itself
(``np.random.default_rng()``, a ``torch.Generator`` of its own) are not global: a sampler
driven by one is followed by serving the recording's order instead (``replay.fetch``).
"""

from __future__ import annotations

import random
import sys


def _torch_state():
    torch = sys.modules.get("torch")
    return None if torch is None else torch.get_rng_state()


def _numpy_state():
    np = sys.modules.get("numpy")
    rnd = getattr(np, "random", None) if np is not None else None
    return None if rnd is None else rnd.get_state()


def taken() -> dict:
    """The state of every global generator of a module the job imported, by name; never
    raises (a generator whose state cannot be read is left out)."""
    out: dict = {}
    for name, get in (("torch", _torch_state), ("numpy", _numpy_state),
                      ("random", random.getstate)):
        try:
            s = get()
        except Exception:  # noqa: BLE001 - that generator is not followed
            continue
        if s is not None:
            out[name] = s
    return out


def _same(name: str, a, b) -> bool:
    if name == "torch":
        return bool(sys.modules["torch"].equal(a, b))
    if name == "numpy":
        return a[0] == b[0] and a[2:] == b[2:] and bool((a[1] == b[1]).all())
    return a == b


def moved(before: dict, after: dict) -> dict | None:
    """The states in ``after`` of the generators that moved since ``before`` (None: none
    moved, the call drew nothing)."""
    out = {}
    for name, s in after.items():
        try:
            if name not in before or not _same(name, before[name], s):
                out[name] = s
        except Exception:  # noqa: BLE001 - cannot compare: kept, setting it is harmless
            out[name] = s
    return out or None


def restore(states: dict | None) -> None:
    """Set each generator to its recorded state (after a served call); never raises."""
    if not states:
        return
    for name, s in states.items():
        try:
            if name == "torch":
                sys.modules["torch"].set_rng_state(s)
            elif name == "numpy":
                sys.modules["numpy"].random.set_state(s)
            elif name == "random":
                random.setstate(s)
        except Exception:  # noqa: BLE001 - that generator goes its own way, as before
            pass
