"""A short job that ends, or does not, the ways a real one can (issue 38, classes 4, 5, 7):
its loop is ``stallbench.watch`` over a list (no torch to import), except ``loader_exit0``.

    user_ends.py MODE [ARG]

- ``chdir``: changes directory first, as Hydra before 1.2 does, then runs 8 batches;
- ``exit0``: ``os._exit(0)`` before its loop; ``loader_exit0``: makes a torch DataLoader,
  then ``os._exit(0)`` before its first batch; ``exitmid``: ``os._exit(0)`` after 3 batches;
- ``empty``: a loop over an empty list; ``rmout``: deletes ARG (its results directory) after
  its loop; ``trace_dir``: replaces the directory ARG with a file after its loop;
- ``before``: sleeps before any loader; ``after2``: sleeps after 2 batches; ``stop``: SIGSTOPs
  itself after 2 batches (every batch is 0.6 s apart, more than the hooks' beat period);
- ``many``: ARG batches as fast as the loop goes (a large trace).
"""

import os
import shutil
import signal
import sys
import time

import stallbench

mode = sys.argv[1]
arg = sys.argv[2] if len(sys.argv) > 2 else ""
if mode == "chdir":
    os.chdir("/")
if mode == "exit0":
    os._exit(0)
if mode == "loader_exit0":
    from torch.utils.data import DataLoader
    loader = DataLoader(list(range(8)), batch_size=4)
    os._exit(0)
if mode == "before":
    time.sleep(600)
items = [] if mode == "empty" else list(range(int(arg) if mode == "many" else 8))
for i, batch in enumerate(stallbench.watch(items)):
    if mode in ("after2", "stop"):
        time.sleep(0.6)
        if i == 1 and mode == "after2":
            time.sleep(600)
        if i == 1 and mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
    if mode == "exitmid" and i == 2:
        os._exit(0)
if mode == "rmout":
    shutil.rmtree(arg)
if mode == "trace_dir":
    os.rmdir(arg)
    open(arg, "w").close()
