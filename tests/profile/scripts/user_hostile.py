"""A job of the shapes issue 38 (class 2 and 3) found the hooks changing or miscounting,
as users write them; it imports nothing of stallbench but ``stallbench.watch``. Each case
prints ``count CASE [batches per epoch]`` (compared with the same script run unprofiled).

    user_hostile.py all          every case below, then os.execv into "second"
    user_hostile.py second       the exec'd second training (ExecDS, 8 batches)
    user_hostile.py fsize        part files cannot be written from epoch 2 on (a full disk)
    user_hostile.py alone        the job's only loader, iterated by two threads at once
"""

import copy
import multiprocessing as mp
import os
import pickle
import resource
import signal
import subprocess
import sys
import threading

from torch.utils.data import DataLoader

import hostile_lib as L
import stallbench

HERE = os.path.dirname(os.path.abspath(__file__))


def say(case, counts):
    print(f"count {case} {counts}", flush=True)


def epochs(it, n=2):
    return [sum(1 for _ in it) for _ in range(n)]


def two_threads(loader):
    """Two threads, each looping over the same loader at the same time."""
    barrier = threading.Barrier(2)
    got = []

    def loop():
        it = iter(loader)
        barrier.wait()
        got.append(sum(1 for _ in it))
    ts = [threading.Thread(target=loop) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sorted(got)


def helper_process():
    # a helper the job spawns, iterating its own loader of a Dataset class the job also uses,
    # then a validation loader, and ended as Ray ends a Ray Train worker: no atexit
    print(f"count helper {epochs(DataLoader(L.HelperDS(12), batch_size=4), 1)}", flush=True)
    print(f"count helper-val {epochs(DataLoader(L.ValDS(40), batch_size=8), 1)}", flush=True)
    os._exit(0)


def exec_training(n_epochs):
    ld = DataLoader(L.ExecDS(16), batch_size=4)
    return [sum(1 for _ in ld) for _ in range(n_epochs)]


def main():
    mode = sys.argv[1]
    if mode == "second":
        say("exec-second", exec_training(1))
        return
    if mode == "alone":                     # the job's one loader, by two threads at once
        say("alone", two_threads(DataLoader(L.ThreadDS(24, sleep_s=0.002), batch_size=2)))
        return
    if mode == "fsize":
        ld = DataLoader(L.FsizeDS(32), batch_size=4)
        first = sum(1 for _ in ld)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
        say("fsize", [first] + [sum(1 for _ in ld) for _ in range(2)])
        return

    say("exec-first", exec_training(1))      # ExecDS#0, as in the exec'd image

    # a --set num_workers this loader cannot take (spawn workers, an unpicklable dataset)
    mp.set_start_method("spawn", force=True)
    sp = DataLoader(L.SpawnDS(8), batch_size=4)
    say("spawn", epochs(sp, 1))

    fwd = L.ForwardingLoader(L.FwdDS(20), batch_size=4)
    say("forwarding", epochs(fwd))

    lk = DataLoader(L.LookupDS(12), batch_size=4, collate_fn=L.to_batch)
    say("lookup", [sum(int(b.x.shape[0]) for b in lk) for _ in range(2)])

    pk = DataLoader(L.PickDS(8), batch_size=4)
    say("pickled-before", epochs(pk, 1))
    blob = pickle.dumps(pk)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYTHONPATH", "STALLBENCH_PROFILE")}
    code = ("import pickle, sys; sys.path.insert(0, sys.argv[1]); "
            "ld = pickle.loads(sys.stdin.buffer.read()); print(sum(1 for _ in ld))")
    r = subprocess.run([sys.executable, "-c", code, HERE], input=blob, env=clean,
                       capture_output=True)
    print(f"unpickled {r.returncode} {r.stdout.decode().strip()} "
          f"{b'stallbench' in blob}", flush=True)
    say("unpickled-here", epochs(pickle.loads(blob), 1))

    cp = DataLoader(L.CopyDS(12), batch_size=4)
    say("copy-original", epochs(cp, 1))
    say("copy-deep", epochs(copy.deepcopy(cp), 1))

    watched = stallbench.watch(L.Chunks(20, 4))     # made once, looped every epoch
    say("watch-reiterable", epochs(watched, 3))

    nx = DataLoader(L.NextDS(80), batch_size=4)
    it = iter(nx)
    got = 0
    for _ in range(12):                     # a next(it) loop past --max-batches
        next(it)
        got += 1
    say("next-loop", [got])

    say("threads", two_threads(DataLoader(L.ThreadDS(24, sleep_s=0.002), batch_size=2)))

    odd = DataLoader(L.OddDS(8), batch_size=4)
    say("odd", epochs(odd, 1))

    # a full disk for one epoch of a loader: the hooks write the figures again afterwards
    fs = DataLoader(L.FsizeDS(16), batch_size=4)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1, hard))
    first = sum(1 for _ in fs)
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    say("fsize-transient", [first, sum(1 for _ in fs)])

    r = subprocess.run([sys.executable, "-c",
                        "import sys; m = sys.modules.get('sitecustomize'); "
                        "print('user-site', getattr(m, 'USER_SITE', False))"],
                       capture_output=True, text=True)
    print(f"helper-python {r.stdout.strip()}", flush=True)
    print(f"job-python user-site {getattr(sys.modules.get('sitecustomize'), 'USER_SITE', False)}",
          flush=True)

    p = mp.get_context("spawn").Process(target=helper_process)
    p.start()
    p.join()

    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), "second"])


if __name__ == "__main__":
    main()
