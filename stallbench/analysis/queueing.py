"""Producers waiting for a core: the finite-source queue behind the what-if's workers term.

Why: the bottleneck formulas treat the cores as a hard budget, cores / CPU per sample, and
nothing below it. Producers that mostly wait (storage latency, network) can be many more than
the cores, and each one's CPU burst then sometimes finds every core taken. Measured on a
2-core VM (issue 39, ``benchmarks/whatif_accuracy.py --latency-ms 40``): the producers' CPU
per sample stayed 2.8-3.2 us at 1 to 8 workers, but their wall per sample grew from 12.4 to
14.7 us at 6 workers, the CPU part of it by half, and the one-point and contention models,
which keep the wall at its fit value, over-predicted 6 workers by 18%.

This is the machine-interference (repairman) model, M/M/c//N: N sources, each alternating
between ``think`` seconds off the CPU (waiting on storage, a queue) and a CPU burst of
``service`` seconds, served by c cores::

    state k (sources on or waiting for a core), k = 0..N:
        up    k -> k+1   at (N - k) / think
        down  k -> k-1   at min(k, c) / service
    throughput = sum_k pi_k * min(k, c) / service        (bursts, i.e. samples, per second)

Everything per sample, so the throughput is the producers' aggregate rate. Its limits are the
two formulas it refines: with c >= N nobody queues and it is N / (think + service) (the
workers term); with think = 0 it is min(N, c) / service (the cores term). The stationary
distribution of this closed network does not depend on the think time's distribution, and a
real c (cores minus what the trainer takes) interpolates the service rate. Assumed, not
measured: exponential bursts (the M in M/M/c), and one queue for all cores.
"""

from __future__ import annotations

import math


def queued_rate(sources: int, think: float, service: float, cores: float) -> float:
    """Aggregate rate (samples/s) of ``sources`` producers, each ``think`` s/sample off the
    CPU and ``service`` s/sample on it, sharing ``cores`` (may be fractional)."""
    if sources <= 0 or not service > 0 or not cores > 0:
        return 0.0 if sources <= 0 or not cores > 0 else math.inf
    think = max(think, 0.0)
    if cores >= sources:
        return sources / (think + service)
    if think == 0.0:
        return min(float(sources), cores) / service
    # log weights of the birth-death chain, normalised at the end (large N overflows floats)
    logs = [0.0]
    ratio = math.log(service / think)
    for k in range(sources):
        logs.append(logs[-1] + math.log(sources - k) + ratio - math.log(min(k + 1.0, cores)))
    top = max(logs)
    weights = [math.exp(x - top) for x in logs]
    busy = math.fsum(w * min(k, cores) for k, w in enumerate(weights)) / math.fsum(weights)
    return busy / service


def waiting_share(sources: int, think: float, service: float, cores: float) -> float:
    """How much longer each producer takes per sample than it would with a core of its own:
    (N / rate) / (think + service) - 1 (0: nobody waits for a core)."""
    rate = queued_rate(sources, think, service, cores)
    alone = think + service
    if not (rate > 0 and math.isfinite(rate) and alone > 0):
        return 0.0
    return max(sources / rate / alone - 1.0, 0.0)
