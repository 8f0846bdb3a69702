"""What measures: a scenario's variants run, repeated and ablated into one typed ``Result``.

Split by concern:

- ``preflight``: everything checked before anything runs (implementation names against the
  registries, what a variant implies on this machine);
- ``runner``: a scenario's variants, repeats and ablations, interleaved per repeat;
- ``tune``: the search for the cheapest stall-free configuration (it drives the runner).

Nothing is imported here: ``stallbench.run`` is light until a module of it is asked for.
"""
