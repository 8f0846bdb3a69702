"""What reads results and decides: slower, faster, the same, or cannot tell.

Split by concern:

- ``rule``: the one statistical rule for "slower"/"faster" (the report uses it too), unpaired
  and paired, each metric's orientation stated once;
- ``metrics``: the per-repeat values of every gated metric, read off a result;
- ``baseline``: current results against a committed baseline (``stallbench gate``);
- ``pairs``: two code trees run in interleaved pairs in one job;
- ``ab``: ``stallbench gate --against REF`` and its confirmation rerun;
- ``worktree``: REF checked out in a temporary git worktree;
- ``calibration``: A/A runs, what the gate can promise on this machine;
- ``history``: change points over a series of results.

Nothing is imported here: ``stallbench.gate`` is light until a module of it is asked for.
"""
