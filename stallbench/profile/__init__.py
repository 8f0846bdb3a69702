"""``stallbench profile``: the user's own training job, measured unchanged (issue 23).

Modules by concern:

- ``bootstrap/sitecustomize.py`` + ``hooks.py``: what runs inside the user's processes
  (standard library and torch only; Ray only where the job imported it), writing per-process
  part files into the run directory;
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
