"""``stallbench profile``: the user's own training job, measured unchanged (issue 23).

Modules by concern:

- ``agent/``: what runs inside the user's processes (the bootstrap, the core, one door per
  loader kind, the replay; standard library only, torch and Ray only through what the job
  imported), writing per-process part files into the run directory; ``agent/wire/`` is
  the one contract between it and the launcher side, both ways;
- ``markers.py``: ``stallbench.watch`` / ``stallbench.stage`` for code the hooks cannot see;
- ``knobs.py``: the ``--set`` keys, their matrix and variant names;
- ``launcher.py``: runs the command once per variant and repeat, streams its output, samples
  its process tree, keeps its exit code, stops it on a signal;
- ``merge.py``: part files -> a typed ``Result`` (executor kind ``"profile"``);
- ``jobrun.py``: the job-run layer ``profile`` and ``tune -- CMD`` share (the scratch
  directory, the check of a run, its trace, the result published with its trace);
- ``redact.py``: secrets (by name and by shape) out of everything recorded or printed.

This face imports nothing, so ``stallbench.watch`` stays cheap in a training script.
"""
