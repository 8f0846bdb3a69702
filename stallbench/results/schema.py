"""The result schema: every part of a stallbench result file, as typed dataclasses.

This module is the one place that says what a result holds. Results are data (asv's lesson):
report, gate, whatif and users' scripts read these objects (never ``.get`` on dicts); JSON
exists only at the edge (``codec``), and loading checks the version and every value's type
before anything trusts a field. A field added here is written by the code and read by every
reader; ``tests/test_results.py`` checks that the committed example of the current version
has exactly the keys the code writes, so the example cannot go stale.

Version history (pyperf keeps it beside the code that writes the format; so do we):

- 1 (2026-11-22): first release. Attribution, stage rates, what-if and resources were
  free-form dicts; ``peak_rss_mb`` held a PSS figure.
- 2 (2026-11-23): every part typed. Renamed: ``peak_rss_mb`` -> ``peak_pss_mb`` (and the
  ``rss_mb`` series -> ``pss_mb``); a repeat's ``workers`` -> ``producer_processes``,
  ``worker_cpu_s`` -> ``producer_cpu_s``, ``startup_s`` -> ``executor_start_s``, ``extra`` ->
  ``executor_figures``; a variant's ``analysis`` -> ``attribution`` (its ``stall_s`` /
  ``stall_share`` -> ``attributed_stall_s`` / ``attributed_stall_share``: epoch time above the
  ingestion-free run, not the trainer's measured stall) and ``notes``; ``stage_rates.trainer_solo_*``
  -> ``trainer_solo``; new ``executor`` facts (producer slots, whether there are producers).
  v1 files load through ``migrate.v1_to_v2``.
  Additions within version 2 (defaults keep older v2 files loading): data-parallel trainers
  (issue 18): ``repeats[].ranks`` (``RankFigures`` per rank; the repeat's own figures are then
  the job's), ``variants[].ranks`` (``RankSummary``: per-rank medians and attribution, the
  straggler, exactly-once delivery), ``WhatIfModel.ranks`` / ``producers_per_rank`` and
  ``WhatIfCheck.ranks``.
  Additive in version 2 (issue 16): a variant's ``startup`` (``StartupFigures``: executor
  start-up of that variant, and whether its runtime was started for it or reused from an
  earlier variant of the same cluster shape); null in files written before. ``executor.
  producers_share_cores``, ``whatif.model.producer_cores`` and ``whatif.measured[].
  oversubscribed``: the what-if's core budget for nodes (real nodes bring their own cores,
  simulated ones share this machine's) and which validation points were oversubscribed.
  Additive in version 2 (issue 20): a variant's ``threads`` (``ThreadBudget``: the producer
  and trainer thread budgets as resolved); the ``"flight"`` executor's facts and
  ``executor_figures["flight"]``.
  Additive since (still version 2; every new field has a default, so earlier v2 files load):
  the trainer's device path (issue 15): ``RepeatFigures.device`` (``DeviceRepeat``: AU with the
  source of its compute time, H2D copies timed by CUDA events: bytes, seconds, GB/s, where the
  host bytes were), ``VariantResult.device`` (``DeviceFigures``: the same over repeats, per-batch
  H2D and step times of the first repeat), ``RepeatFigures.sequence_cut`` (``SequenceCut``:
  sequences a padded batch format cut at ``dataset.sequence_max_len``),
  ``Resources.gpu_memory_mb`` (NVML used memory per GPU per sample) and ``Timeline.h2d_ms`` /
  ``gpu_step_ms`` (per batch, CUDA events).
  Additive (issue 14, still version 2): ``repeats[].phases`` (start-up vs steady state of the
  run, ``measure.phases``) and ``repeats[].load`` (CPU taken by processes outside the run,
  ``measure.load``); a variant's ``phases`` (their summaries, and an EXTRAPOLATED full epoch
  when ``max_batches`` capped the run) and ``recommendation``; the attribution's ``basis``
  (its parts now come from steady state, each run scaled to the same batches),
  ``startup_cost_s`` / ``startup_cost_share`` / ``startup_cost_interval`` (start-up as its own
  part: compute + stages + overhead + start-up cost = the median epoch), ``steady_epoch_s`` and
  ``steady_attributed_stall_share``; ``analysis.recommendation`` (the scenario's top one).
  Not to be confused with issue 16's ``variants[].startup`` (see "Two start-ups" below).
  Additions within version 2 (optional, with defaults: older v2 files still load):
  issue 17: ``WhatIfModel.kind`` (the what-if model: "one-point" or "contention"),
  ``fit_variants``, ``contention_producer`` / ``contention_trainer`` (sigma per busy core),
  ``contention_fit``, ``startup_per_worker_s``, ``item_rows``, ``batch_rows``,
  ``start_fixed_s``; ``WhatIfPoint.model`` and its interval ``low_samples_s`` /
  ``high_samples_s``; ``WhatIfCheck.model`` and ``predicted_steady_samples_s``;
  ``WhatIfValidation.backtest`` (``BackTest``: leave-one-out errors and interval coverage).
  Merged with issues 16 and 18: ``BackTestPoint.ranks`` and ``BackTestPoint.oversubscribed``.
- 3 (2026-11-24, issue 25): one name per figure. Renamed: a recommendation's ``stall_share``
  (``variants[].recommendation`` and ``analysis.recommendation``; the steady-state attributed
  stall share, while a variant's ``stall_share`` is the whole run's measured stall) ->
  ``steady_attributed_stall_share``. v2 files load through ``migrate.v2_to_v3`` (v1 through
  ``v1_to_v2`` then it). Additive in version 3 (defaults keep earlier v3 files loading):
  ``RankSummary.others_wait_s`` (what the other ranks spent in the all-reduce beyond the
  straggler candidate, measured), ``RankSummary.straggler_evidence`` (which test named it),
  ``Recommendation.measured_speedup`` / ``measured_variant`` (a suggested value this run
  measured), ``predicted_low`` / ``predicted_high`` (the back-test's interval) and
  ``not_predicted`` (why no figure), ``prediction_model`` (the what-if model whose
  back-test at the prediction's extrapolation was best), ``BackTestPoint.extrapolation`` /
  ``direction`` (how far outside its fit each back-tested count lay) and
  ``BackTest.alternatives`` (the leave-one-out of every other model), ``Phases.no_steady_reason`` (a run too short for a
  steady state, a window slower than its run or a rate above the measured CPU limit says so:
  ``measure.phases``), ``Attribution.refused`` (a stage stall longer
  than the run: refused, ``inconclusive_because = "impossible"``)
  and the straggler rule on own time (``analysis.ranks``).
  Additive in version 3 (issue 39, attribution from the measured waits on ``profile``):
  ``Attribution.interference_s``, ``step_ratio``, ``step_noise_share``,
  ``wait_bound_speedup``; ``inconclusive_because`` may be ``"closure"`` or
  ``"busy_machine"``; ``Recommendation.not_the_knobs_gain``.
  Additive in version 3 (issue 57, the replay that follows the job): ``Attribution.stage_ratio``
  (a stage not served that moved in a served run); ``inconclusive_because`` may be
  ``"stage_moved"`` or ``"serving"``; ``RepeatFigures.stall_se_s`` (a profile run's stall's
  standard error from its batches' spread).
  Additive in version 3 (issue 27, workers that pay): ``ExecutorFacts.workers_kept``
  (loader workers kept across runs, forked every run though they could be kept, or nothing
  to keep), ``Recommendation.also`` (further measured-motivated changes, e.g.
  ``loader.persistent_workers``), ``RepeatFigures.workers_reused`` (a run's loader workers
  were kept from an earlier run, or forked for it), ``TuneFigures.runs_not_counted`` (a tune
  step whose workers are kept is judged on its runs that reused them).
  Additive in version 3 (issue 23, ``stallbench profile``; executor kind ``"profile"``): ``Result.profile``
  (``ProfileCommand``: the command, redacted) and ``VariantResult.profile``
  (``ProfileVariant``: every loader stream per rank, ``ProfileLoader`` / ``ProfileStage``).
  Additive in version 3 (issue 28, ``stallbench profile --analyze``): ``ProfileVariant.analysis``
  (``ProfileAnalysis``: the ablation runs by replay, each a ``ProfileAblation``, done or why
  not; the data stall full - compute-only with its interval); the first variant's
  ``attribution`` is filled as for scenarios.
  Additive in version 3 (issue 39, one decider): ``analysis.whatif.advice`` (``KneeAdvice``:
  profile's knee advice, decided in ``analysis.knee``; None in older files and for scenarios).
  Additive in version 3 (issue 39, predictions that cover or none):
  ``analysis.whatif.points[].not_predicted`` and ``analysis.whatif.knee.not_predicted`` (why
  the model's figure is not given: its back-test missed by more than the threshold or reaches
  no count that far; "" when given, with its own interval in ``low/high_samples_s``), and
  ``analysis.whatif.backtest.repeat_log_half_width`` (the floor of every interval: how far
  one point's repeats spread); ``variants[].profile.analysis.budget_basis`` (how the
  recording budget followed the machine's available memory).
  Additive in version 3 (issue 42, the thread budget shown): ``variants[].threads.
  trainer_torch_threads`` (torch's threads read in the trainer); ``profile`` results now
  carry ``variants[].threads`` too, read inside the job (``producer_threads``: torch's threads
  read in its loader workers; ``trainer_threads`` None: the job's pyarrow pool is not read).
  Additive in version 3 (issue 41, ``stallbench tune -- CMD``): ``Result.tune`` (``JobTune``:
  the trials on the user's job, each a ``JobTrial``, its compute-only ceiling and the
  confirmed answer ``JobTuneBest``); None in every other result.
  Additive in version 3 (issue 56, a Ray cluster's workers measured where they run):
  ``ProfileLoader.node``, ``RankFigures.node`` and ``RankStats.node``: the Ray node a rank's
  process ran on (``<ip>/<node id, 8 hex>``); "" where not known (outside Ray, older files).
  Additive in version 3 (issue 39, one story): ``analysis.whatif.model.bound_stage`` (the data
  stage the fit variant's conclusive attribution names bound, which the what-if's "cannot
  keep up" then names; "" in older files and where none is named).
  Additive in version 3 (issue 56, torchrun and Slurm across machines): the same ``node``
  fields hold a multi-node torchrun's node as ``<node rank> (<host>)``, and
  ``ProfileVariant.nodes`` (``ProfileNode``: one row per node of a multi-node torchrun, a
  node that brought no figures named with why; [] otherwise).
  Additive in version 3 (issue 60, ``profile --live``): ``ProfileVariant.over_time``
  (``StallOverTime``: per loader and rank, ``StallSeries`` of windows on one grid: when and
  where the job waited); None without ``--live`` and in older files.

Names say what they count (Ray Data's lesson). Three stall figures exist and never share a name:

- ``wait_s``: the trainer blocked on the next batch;
- ``stall_s`` / ``stall_share``: every second of the run the trainer was not computing (wait +
  its own data work: unpack, decompress, collate, copy), from the full run's own clocks;
- ``attribution.attributed_stall_s`` / ``attributed_stall_share``: how much longer the full run
  took than the ingestion-free (compute-only) run, split over the stages by the ablations.

Two start-ups exist and never share a name:

- ``variants[].startup`` (``StartupFigures``, issue 16) and ``repeats[].executor_start_s``:
  bringing the executor up (starting or reusing a Ray runtime, warming producers) *before*
  the measured run; not part of ``epoch_s``;
- ``repeats[].phases`` / ``variants[].phases`` (``Phases`` / ``PhaseSummary``, issue 14) and
  ``attribution.startup_cost_s``: the first part of the measured run itself, from the
  trainer's first request until every producer has delivered its first work item (time to
  first batch included), as against the steady state after it; inside ``epoch_s``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 3
SUPPORTED_VERSIONS = (1, 2, 3)


# ------------------------------------------------------------------------------ primitives

@dataclass
class Summary:
    """A figure over repeats: raw values kept so later statistics (gate, CI) can be redone."""

    median: float
    min: float
    max: float
    values: list[float]

    @classmethod
    def of(cls, values: list[float]) -> "Summary":
        vals = [float(v) for v in values]
        if not vals:
            return cls(math.nan, math.nan, math.nan, [])
        return cls(statistics.median(vals), min(vals), max(vals), vals)

    def derived(self) -> dict[str, float]:
        """The figures ``values`` give (``of``'s rule), by field: the reader refuses a file whose
        summary says otherwise (``codec``), so a hand-edited median cannot stand beside the
        repeats it claims to summarise."""
        s = Summary.of(self.values)
        return {"median": s.median, "min": s.min, "max": s.max}


@dataclass
class Interval:
    """A (low, high) interval; both equal the point estimate when no spread was measured."""

    low: float
    high: float

    @property
    def width(self) -> float:
        return self.high - self.low


# ---------------------------------------------------------------------- one measured run

@dataclass
class StageSeconds:
    """Producer-side seconds per stage, summed over the work items of one run, plus the
    trainer's share of transfer. ``*_cpu`` are CPU clocks of the same work (a storage wait
    takes wall time without a core); ``fetch_io_wait`` is the EMULATED storage wait inside
    ``fetch``; ``transfer`` = ``transfer_producer`` + ``transfer_trainer``."""

    fetch: float = 0.0
    fetch_io_wait: float = 0.0
    preprocess: float = 0.0
    transfer: float = 0.0
    transfer_producer: float = 0.0
    transfer_trainer: float = 0.0
    fetch_cpu: float = 0.0
    preprocess_cpu: float = 0.0
    transfer_producer_cpu: float = 0.0


@dataclass
class StageRows:
    """Rows each stage processed in one run (fetch and preprocess see input rows, transfer
    the rows that left preprocessing: filters and downsampling make them differ)."""

    fetch: int = 0
    preprocess: int = 0
    transfer: int = 0


@dataclass
class ByteCounts:
    """Bytes of one run. ``raw_bytes``: encoded batches before compression; ``wire_bytes``:
    what producers handed over (compressed size when compressed); ``ipc_bytes``: the part of
    ``wire_bytes`` that crossed a process boundary (0 when the trainer produced its own
    batches); ``storage_bytes``: compressed Parquet bytes fetched."""

    storage_bytes: int = 0
    raw_bytes: int = 0
    wire_bytes: int = 0
    ipc_bytes: int = 0


@dataclass
class DeviceRepeat:
    """One run's accelerator figures (``measure.device_clock`` says how each is taken).

    ``au`` (accelerator utilisation, MLPerf Storage's figure) = ``compute_s`` / the run's
    epoch. ``compute_kind`` says where ``compute_s`` comes from: ``gpu`` (CUDA events around
    each step), ``emulated`` (the host clock around an EMULATED step) or ``cpu`` (the host
    clock around a model step on the CPU). H2D figures exist only where batches were copied to
    an accelerator, timed by CUDA events on the copy's stream; ``h2d_from_*`` count the copies
    by where their host bytes were: the loader's pinned pool (no host copy), the pin thread's
    pinned ring (one host copy, off the trainer thread) or pageable memory."""

    device: str                     # "cpu" or the CUDA device ("cuda:0")
    compute_kind: str               # "gpu", "emulated" or "cpu"
    compute_clock: str              # "cuda_events" or "host"
    compute_s: float                # model step time summed over the run, by compute_clock
    au: float                       # compute_s / epoch_s
    step_ms_median: float | None = None
    h2d_batches: int = 0
    h2d_bytes: int = 0
    h2d_s: float | None = None      # copy time summed (CUDA events); None: nothing copied
    h2d_gb_s: float | None = None   # h2d_bytes / h2d_s
    h2d_ms_median: float | None = None
    h2d_from_pool: int = 0
    h2d_from_ring: int = 0
    h2d_from_pageable: int = 0
    device_prefetch: int = 0        # batches whose copy ran ahead on a side stream (0: none)
    # AU over the run's steady window (``Phases``: after start-up): the step times of the
    # steady batches, by ``compute_clock`` (CUDA events on a GPU), over ``Phases.steady_s``.
    # None: the run had no steady window. Whole-run ``au`` counts start-up (the loader's
    # first batches, a GPU's first kernels) against the accelerator; this does not.
    steady_compute_s: float | None = None
    steady_au: float | None = None


@dataclass
class SequenceCut:
    """What a padded batch format did to the id sequences of one run: sequences longer than
    the padded length (``dataset.sequence_max_len``) lose their tails. Counted by the producer
    from the Arrow list lengths of every batch it encoded."""

    seq_len: int                    # the padded length
    sequences: int = 0              # sequences encoded (rows x sequence features)
    sequences_cut: int = 0          # longer than seq_len
    ids: int = 0                    # ids in those sequences before padding
    ids_cut: int = 0                # ids dropped
    longest: int = 0                # longest sequence seen


@dataclass
class RepeatFigures:
    """Everything measured in one run of one variant (or of one of its ablations)."""

    epoch_s: float                  # wall time of the measured run (all epochs)
    samples: int                    # rows the trainer consumed
    batches: int
    throughput_samples_s: float     # samples / epoch_s
    steady_throughput_samples_s: float  # excluding warm-up batches and time to first batch
    stall_s: float                  # trainer time not computing: wait + trainer-side data work
    wait_s: float                   # trainer blocked waiting for the next batch
    trainer_transfer_s: float       # trainer-side unpack / decompress / collate / pin / copy
    compute_s: float                # model steps
    time_to_first_batch_s: float
    peak_pss_mb: float              # trainer + loader workers (+ local Ray workers), PSS, sampled
    executor_start_s: float = 0.0   # executor start (e.g. a Ray runtime), not in epoch_s
    trainer_cpu_s: float = 0.0      # CPU time of the trainer process (all its threads)
    # CPU time of every process producing outside the trainer, over the run (forked loader
    # workers: all their threads, start-up and hand-off; a Ray cluster on this machine: its
    # workers, raylets and daemons); None where not measurable (none, or a remote cluster).
    producer_cpu_s: float | None = None
    # the loader workers that produced this run were kept from an earlier run of the variant
    # (``loader.persistent_workers``, ``Executor.workers_reused``): True; forked for it: False;
    # None: no loader workers to keep. A kept variant's first run forks them; its ablation runs
    # reuse them (the local executor's kept workers serve every ablation of the variant).
    workers_reused: bool | None = None
    stage_s: StageSeconds = field(default_factory=StageSeconds)
    stage_rows: StageRows = field(default_factory=StageRows)
    bytes: ByteCounts = field(default_factory=ByteCounts)
    producer_processes: int = 0     # distinct producer processes that did the work
    # The executor's private figures of this run (Ray: operator stats, cluster, start-up
    # breakdown, "faults"; local: "buffer_pool" use). Free-form by design: no reader of
    # stallbench depends on them; they are there for a person and for the executor's tests.
    executor_figures: dict[str, Any] = field(default_factory=dict)
    # With ``trainers.ranks`` > 1: every rank's own figures of this run (the fields above are
    # then the job's, see ``RankFigures``); empty for a single in-process trainer.
    ranks: list["RankFigures"] = field(default_factory=list)
    device: DeviceRepeat | None = None          # AU and H2D copies (None: compute-only caches)
    sequence_cut: SequenceCut | None = None     # None: the format keeps every id, or no sequences
    phases: Phases | None = None    # start-up vs steady state of this run (issue 14)
    load: ForeignLoad | None = None   # CPU others took from the machine during this run
    # issue 57 (profile --analyze): the standard error of this run's measured stall (steady
    # window scaled to all batches, as ``analysis.waits.stall_of``) from its batches' spread
    # (``analysis.waits.stall_se``): how far a part, a difference of two runs' stalls, may
    # come out below 0 by noise alone; None where not measured
    stall_se_s: float | None = None


@dataclass
class RankFigures:
    """One data-parallel rank's figures of one run (``trainers.ranks`` > 1).

    Each rank is a process running the measured trainer loop over its own shard, with a
    synchronous step: after every model step the ranks all-reduce (the gradients, or a
    one-element tensor for the emulated step), so a rank that waits for data holds up all.
    Time in that all-reduce is ``sync_s`` and is neither compute nor stall; a rank's exposed
    stall is what it spent getting its own batches:
    ``stall_s = epoch_s - compute_s - sync_s`` (= wait + trainer-side transfer + loop
    overhead), Ray Train's "exposed data loading time" of that rank.

    The job's figures of the run (the ``RepeatFigures`` holding these) are: ``epoch_s`` the
    max over ranks (they start together, after a barrier); ``samples``, ``batches``, CPU,
    stage seconds, rows and bytes the sums; ``throughput_samples_s`` samples / epoch_s;
    ``steady_throughput_samples_s`` the sum of the ranks' steady rates; ``stall_s`` the max
    over ranks (the max exposed stall), with ``wait_s``, ``trainer_transfer_s`` and
    ``compute_s`` those of that rank; ``time_to_first_batch_s`` the max over ranks;
    ``peak_pss_mb`` sampled over the whole job by stallbench's own process.
    """

    rank: int
    epoch_s: float                  # from the common start to this rank's last step
    samples: int
    batches: int                    # this rank's steps
    steady_throughput_samples_s: float
    stall_s: float                  # epoch - compute - sync: getting its own batches
    wait_s: float                   # blocked on its next batch
    trainer_transfer_s: float       # its own unpack / decompress / collate / copy
    compute_s: float                # model steps, without the all-reduce
    sync_s: float                   # in the step's all-reduce: waiting for the other ranks
    time_to_first_batch_s: float
    peak_pss_mb: float              # this rank's process tree (it and its loader workers)
    trainer_cpu_s: float = 0.0
    producer_cpu_s: float | None = None
    work_items: int = 0             # deliveries (row groups or parts of them) it received
    last_steps: int = 0             # steps at which its batch arrived last of all ranks
    # EMULATED (``trainers.straggler_delay_ms``): latency injected into this rank in this run,
    # as measured around the injection (0 for every other rank)
    straggler_delay_s: float = 0.0
    node: str = ""                  # the machine it ran on, where known (a profiled Ray job;
                                    # a multi-node torchrun's "<node rank> (<host>)")


@dataclass
class Phases:
    """One run split into start-up and steady state on its per-batch timeline
    (``measure.phases`` gives the rule: the steady window starts when the trainer asks for
    the first batch of work item S, S = max(producers, 1), i.e. once every producer has
    delivered its first item). k = ``startup_batches``, n = all batches of the run:

        startup_s       = t_start[k]                  (wall time before the steady window)
        startup_stall_s = startup_s - sum(compute[:k])
        steady_s        = epoch_s - startup_s
        steady_stall_s  = steady_s - sum(compute[k:])   (wait + trainer-side data work)
        steady_epoch_s  = steady_s * n / (n - k)       (the run as if every batch were steady)
        startup_cost_s  = epoch_s - steady_epoch_s     (what start-up cost beyond the steady rate)

    ``steady_batches`` = 0: the run ended before a steady window (too short); the steady
    figures are then NaN and readers fall back to the whole run."""

    startup_items: int              # S: work items (one per producer) that make up start-up
    startup_batches: int
    startup_samples: int
    startup_s: float
    startup_stall_s: float
    steady_batches: int
    steady_samples: int
    steady_s: float
    steady_stall_s: float
    steady_wait_s: float
    steady_compute_s: float
    steady_stall_share: float       # steady_stall_s / steady_s
    steady_epoch_s: float
    startup_cost_s: float
    no_steady_reason: str = ""      # why the run has no steady window (issue 25), "" when it has

    @property
    def has_steady(self) -> bool:
        return self.steady_batches > 0


@dataclass
class ForeignLoad:
    """CPU the machine spent on anything but this run while it ran (``measure.load``):
    machine-wide busy CPU (``psutil.cpu_times``: user + nice + system + irq + softirq) minus
    the run's own process tree (the trainer, its children, reaped ones included, and the Ray
    processes it started), over the run's wall time. Hypervisor steal (time this VM wanted a
    core and did not get one) is kept apart; None where the OS does not report it."""

    wall_s: float
    busy_cpu_s: float
    own_cpu_s: float
    foreign_cpu_s: float            # max(busy_cpu_s - own_cpu_s, 0)
    foreign_cores: float            # foreign_cpu_s / wall_s: cores other processes took
    steal_cores: float | None = None
    cores: float = 0.0              # logical cores of the machine, for scale

    @property
    def taken_cores(self) -> float:
        """Cores this run could not have: other processes plus hypervisor steal."""
        return self.foreign_cores + (self.steal_cores or 0.0)


# --------------------------------------------------------------------- per-variant parts

@dataclass
class ExecutorFacts:
    """What the executor said about itself for this variant (analysis reads these, never the
    config): how many producers work in parallel outside the trainer, and on how many nodes."""

    kind: str
    producer_slots: int             # 0: the trainer produces its own batches
    has_producers: bool
    producer_nodes: int | None = None   # nodes carrying producers (Ray), None where not a notion
    nodes_simulated: bool = False   # nodes are simulated on this machine (they share its cores)
    # the producers run on this machine's cores (local workers, a local or simulated Ray, a
    # `ray start` cluster whose nodes are all on this host), not on cores of their own
    # (nodes on other machines): what the what-if's core budget assumes (issue 16)
    producers_share_cores: bool = True
    # the config keys that set producer_slots ("loader.num_workers", ...): variants that differ
    # only in these form one scaling curve for the what-if
    scaling_knobs: list[str] = field(default_factory=list)
    # loader workers kept across the variant's runs (``Executor.workers_kept``): True kept,
    # False forked for every run though the executor could keep them, None nothing to keep
    workers_kept: bool | None = None


@dataclass
class ThreadBudget:
    """The thread budgets a variant ran with, as resolved (``stallbench.threads``): what the
    oversubscription comparisons read."""

    producer_threads: int | None    # per producer process; None: no producer processes, no
                                    # budget (library defaults), or decided by remote producers
    trainer_threads: int | None     # pyarrow's CPU pool in the trainer; None: library default
    local_producers: int            # producer processes sharing this machine's cores
    cores: int                      # this machine's cores (the default budget splits them)
    # torch's intra-op threads in the trainer process, read there with torch.get_num_threads()
    # (a profiled job's own, set by OMP_NUM_THREADS or the job; a scenario's model.torch_threads
    # or torch's default). None: not read (torch not imported; results written before)
    trainer_torch_threads: int | None = None


@dataclass
class StageRates:
    """Measured per-producer stage rates (rows/s of one producer's time; CPU-time rates beside
    wall-time ones) and storage MB/s: the what-if model's inputs. None: not measured."""

    fetch_rows_s: float | None = None
    fetch_cpu_rows_s: float | None = None
    preprocess_rows_s: float | None = None
    preprocess_cpu_rows_s: float | None = None
    transfer_producer_rows_s: float | None = None
    transfer_trainer_rows_s: float | None = None
    storage_mb_s: float | None = None
    compute_rows_s: float | None = None
    rows_out_per_row_in: float | None = None
    compute_only_rows_s: float | None = None


@dataclass
class TrainerSolo:
    """The data work of a few work items done in the trainer's own process with nothing else
    running (``runner.solo_probe``): what the variant's data work costs with no workers."""

    data_s_per_sample: float
    item_s: float


@dataclass
class ByteFigures:
    """One run's bytes, per sample and as a ratio (``ByteCounts`` of the first full run)."""

    storage_bytes: int = 0
    raw_bytes: int = 0
    wire_bytes: int = 0
    ipc_bytes: int | None = None
    crossed_process: bool | None = None
    compression_ratio: float | None = None
    wire_bytes_per_sample: float | None = None


@dataclass
class PartIntervals:
    """Bootstrap intervals of each attributed part."""

    compute_s: Interval
    fetch_stall_s: Interval
    preprocess_stall_s: Interval
    transfer_stall_s: Interval
    overhead_s: Interval


@dataclass
class Attribution:
    """Differential stall attribution of one variant (``analysis.differential``)."""

    method: str                     # "chain" or "shapley"
    interval: str                   # how the intervals were made, in words
    compute_s: float                # the ingestion-free (compute-only) run's epoch
    fetch_stall_s: float
    preprocess_stall_s: float
    transfer_stall_s: float
    overhead_s: float               # loader start-up / hand-off: all stages free vs no loader
    epoch_s: float                  # median full epoch
    attributed_stall_s: float       # the three stage stalls + overhead
    attributed_stall_share: float   # attributed_stall_s / epoch_s
    overhead_share: float
    bound_by: str                   # "fetch", "preprocess", "transfer" or "compute"
    ideal_speedup: float            # epoch / epoch without the bounding stage's stall
    intervals: PartIntervals
    closure_error: float            # (parts - median full epoch) / median full epoch
    ablation_epoch_s: dict[str, float]   # median epoch per ablation run, by ablation name
    compute_noise_s: float | None = None
    compute_noise_share: float | None = None
    conclusive: bool = True
    # "compute_noise", "interval", "impossible"; from the waits (issue 39) also "closure"
    # (negative parts stored as 0 break the sum to the measured stall) or "busy_machine";
    # issue 57: "stage_moved" (a stage not served moved in a served run) or "serving" (a
    # served run waited longer than the full run); ``analysis.waits.WITHHOLDS`` lists those
    # whose parts are withheld
    inconclusive_because: str | None = None
    refused: str = ""               # the impossible figure and why it was refused (issue 25)
    negative_parts: list[str] = field(default_factory=list)
    verdict: str = ""
    # Issue 14: the parts above come from steady state (each run's steady window scaled to
    # all its batches, ``Phases.steady_epoch_s``) when every run has one; start-up is its own
    # part (what it cost beyond the steady rate), so compute + stages + overhead +
    # startup_cost_s = epoch_s.
    basis: str = "whole run"        # "steady state" or "whole run (<why>)"
    startup_cost_s: float = 0.0     # median full epoch - median full steady epoch
    startup_cost_share: float = 0.0   # startup_cost_s / epoch_s
    startup_cost_interval: Interval | None = None
    steady_epoch_s: float | None = None   # median full run's steady epoch (the parts' total)
    # attributed_stall_s / steady_epoch_s: the share a long epoch would show; the verdict's
    steady_attributed_stall_share: float | None = None
    # Issue 39 (profile: attribution from the measured waits, ``analysis.waits``): the data
    # path's cost on the model step, its own figure (never folded into a stall part): the
    # full run's steps minus the compute-only run's over its batches, where that step moved
    # beyond its noise; None where not measured or within noise.
    interference_s: float | None = None
    step_ratio: dict[str, float] = field(default_factory=dict)   # step per batch / the full run's
    # issue 57: a stage that ran for real in a served run and moved there beyond its noise,
    # "<ablation>:<part>" -> its seconds / the full run's (``inconclusive_because =
    # "stage_moved"``: the parts are withheld)
    stage_ratio: dict[str, float] = field(default_factory=dict)
    step_noise_share: float | None = None   # a step ratio within 1 +- this is the same step
    # 1 / (1 - the larger of the whole-run and steady measured stall shares): what removing
    # every wait gives at most; ``ideal_speedup`` never exceeds it
    wait_bound_speedup: float | None = None

    def part_s(self, part: str) -> float:
        """A stage's stall (``fetch``, ``preprocess``, ``transfer``), ``overhead`` or ``compute``."""
        return float(getattr(self, _PART_FIELD[part]))

    def part_interval(self, part: str) -> Interval:
        return getattr(self.intervals, _PART_FIELD[part])


_PART_FIELD = {"fetch": "fetch_stall_s", "preprocess": "preprocess_stall_s",
               "transfer": "transfer_stall_s", "overhead": "overhead_s", "compute": "compute_s"}


@dataclass
class PhaseSummary:
    """A variant's start-up and steady state over its full runs' repeats (``Phases``), and
    what a whole epoch of the dataset would take when ``max_batches`` capped the runs:
    EXTRAPOLATED, never measured, from each repeat's steady rate plus its measured start-up:

        extrapolated_full_epoch_s = startup_s + (full_epoch_samples - startup_samples)
                                    * steady_s / steady_samples
        (its stall likewise, with steady_stall_s in place of steady_s)."""

    rule: str                       # where start-up ended, in words
    startup_s: Summary
    startup_cost_s: Summary
    startup_stall_s: Summary
    steady_s: Summary
    steady_stall_share: Summary
    steady_samples_s: Summary       # steady_samples / steady_s
    full_epoch_samples: int | None = None   # samples a whole epoch (x epochs) would give
    extrapolated_full_epoch_s: Summary | None = None
    extrapolated_full_epoch_stall_share: Summary | None = None


@dataclass
class Recommendation:
    """The next change to try for one variant (``analysis.advice``), from its steady-state
    attribution and the what-if model. ``predicted_speedup`` is PREDICTED (steady state,
    vs the variant as measured), never measured; ``predicted_from`` says by what."""

    variant: str
    bound_by: str
    steady_attributed_stall_share: float | None   # steady-state attributed stall share it starts from
    action: str                     # the change, in words ("add loader workers")
    knob: str | None = None         # the scenario key to change ("loader.num_workers")
    value: Any = None               # the suggested value, where there is one
    predicted_speedup: float | None = None
    predicted_from: str = ""        # "what-if model" or "attribution: ideal <stage> (upper bound)"
    conclusive: bool = True
    text: str = ""                  # the line printed and shown first in the report
    # issue 25: a value measured in the same run is quoted as measured, never predicted
    measured_speedup: float | None = None   # MEASURED steady ratio of that variant to this one
    measured_variant: str | None = None
    # the interval of a what-if prediction, from the leave-one-out back-test's errors
    predicted_low: float | None = None
    predicted_high: float | None = None
    not_predicted: str = ""         # why no gain is predicted (back-test error above 25%)
    # the what-if model that made ``predicted_speedup`` ("one-point", "contention"): the
    # one whose back-test at the prediction's extrapolation is best (issue 25)
    prediction_model: str | None = None
    # further changes to try beside ``action``, each in words with the MEASURED figure that
    # motivates it (issue 27: ``loader.persistent_workers`` where forked workers' start-up is a
    # material share of the epoch)
    also: list[str] = field(default_factory=list)
    # issue 39: why ``measured_speedup`` is not the knob's gain ("" when it is): the model step
    # got faster beyond its noise, or the ratio is above what the baseline's wait allows
    # (``analysis.waits.check_gain``); the text then says what else changed
    not_the_knobs_gain: str = ""


@dataclass
class Timeline:
    """Per batch of one full run: when the trainer asked, how long it waited, its own data
    work and the model step (seconds), and the batch's rows."""

    t_start_s: list[float] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    transfer_s: list[float] = field(default_factory=list)
    compute_s: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    # Per batch, by CUDA events (ms): its host -> device copy (0: none, already on the
    # device), and the model step on the GPU; None where no accelerator was used.
    h2d_ms: list[float] | None = None
    gpu_step_ms: list[float] | None = None


@dataclass
class Resources:
    """Sampled series of one full run. ``pss_mb``: the process tree's PSS sum (shared pages of
    forked workers counted once; the loader's shared memory counted once at its size);
    ``rss_sum_mb``: the plain RSS sum beside it (over-counts shared pages)."""

    t_s: list[float] = field(default_factory=list)
    cpu_percent_per_core: list[list[float]] = field(default_factory=list)   # one series per core
    pss_mb: list[float] = field(default_factory=list)
    rss_sum_mb: list[float] = field(default_factory=list)
    object_store_mb: list[float] | None = None
    gpu_util_percent: list[list[float]] | None = None   # per sample, one value per GPU
    gpu_memory_mb: list[list[float]] | None = None      # per sample, NVML used memory per GPU
    pss_exact_sweeps: int = 0
    pss_sweep_s: float = 0.0


@dataclass
class DeviceFigures:
    """A variant's accelerator figures over its full runs (``DeviceRepeat`` per repeat); the
    per-batch series of the first repeat are in its ``Timeline`` (``h2d_ms``, ``gpu_step_ms``)."""

    device: str
    compute_kind: str               # "gpu", "emulated" or "cpu": what AU's compute time is
    compute_clock: str              # "cuda_events" or "host"
    au: Summary
    step_ms: Summary                # median step time per batch, over repeats
    h2d_gb_s: Summary | None = None
    h2d_ms: Summary | None = None   # median copy time per batch, over repeats
    h2d_bytes_per_batch: float | None = None
    host_memory: str = ""           # where copied batches came from (pool / ring / pageable)
    device_prefetch: int = 0
    steady_au: Summary | None = None   # AU over each run's steady window; None: no run had one


@dataclass
class RankStats:
    """One rank's figures over the variant's full runs: medians over repeats."""

    rank: int
    stall_s: float
    wait_s: float
    trainer_transfer_s: float
    compute_s: float
    sync_s: float
    steady_throughput_samples_s: float
    time_to_first_batch_s: float
    last_step_share: float          # share of the job's steps at which it was the last rank
    straggler_delay_s: float = 0.0  # EMULATED delay injected (median over repeats)
    attribution: Attribution | None = None   # of this rank's own time (epoch - sync)
    node: str = ""                  # the machine it ran on, where known (a profiled Ray job;
                                    # a multi-node torchrun's "<node rank> (<host>)")


@dataclass
class ExactlyOnce:
    """Who got which batches in the first full run: every batch of the job's work list must
    reach exactly one rank. ``dropped_batches`` / ``dropped_rows``: what an equal split
    removed on purpose (Ray's ``streaming_split(N, equal=True)`` drops the last
    ``batches mod N`` batches, so every rank takes the same number of steps)."""

    expected_batches: int
    delivered_batches: int
    duplicate_batches: int
    dropped_batches: int
    expected_rows: int = 0
    delivered_rows: int = 0
    dropped_rows: int = 0


@dataclass
class RankSummary:
    """The ranks of a data-parallel variant (``trainers.ranks`` > 1): how they were run, each
    rank's figures, and the straggler.

    The *straggler* is the rank that reaches the all-reduce last: the largest own time
    (exposed stall + model step, summed over the steps every rank took; median over the full
    runs), named only when its ``straggler_excess_s`` (its own time minus the median of the
    other ranks') is larger than ``noise_s``, the 99th percentile of that excess with the
    steps dealt to the ranks at random (``analysis.ranks``: ~1% false alarms among
    exchangeable ranks, bursty stalls included). ``others_wait_s`` is what the other ranks
    spent in the all-reduce beyond what the candidate spent there (measured).
    ``gain_if_median_pace_s`` (ESTIMATED from the measured per-step stalls) is how much less
    the job would have stalled had the straggler kept pace with the median of the other
    ranks at every step: per step the job waits for its slowest rank, so the gain is the sum
    over steps of (max over ranks) - (max over ranks with the straggler at that median).
    """

    world: int
    launcher: str                   # "processes" or "ray_actors"
    backend: str                    # torch.distributed backend: "gloo" or "nccl"
    sharding: str                   # how the data reached the ranks, in words
    producers_per_rank: bool        # each rank has its own producers (local) or one pool (Ray)
    launch_s: float                 # starting the ranks (processes, process group), not in epochs
    ranks: list[RankStats]
    max_stall_s: Summary            # max over ranks, per full run (= the variant's stall_s)
    median_stall_s: Summary         # median over ranks, per full run
    spread_s: float                 # max - min rank stall (median over full runs)
    noise_s: float                  # what an excess must beat to name a straggler
    straggler: int | None           # None: the spread is within the noise
    candidate: int                  # the rank with the largest stall, named or not
    straggler_excess_s: float       # candidate's own time - median of the others' (median over runs)
    gain_if_median_pace_s: float    # ESTIMATED, see the class docstring
    gain_speedup: float             # epoch / (epoch - gain)
    last_rank_per_step: list[int] = field(default_factory=list)   # first full run
    timeline_rank: int = 0          # the variant's ``timeline`` is this rank's (largest stall)
    exactly_once: ExactlyOnce | None = None
    verdict: str = ""
    others_wait_s: float = 0.0      # the others' all-reduce wait beyond the candidate's (measured)
    straggler_evidence: str = ""    # which test named the straggler, in words ("" when none)


@dataclass
class StartupFigures:
    """Executor start-up of one variant. A runtime (a Ray cluster) is kept across the variants
    of a scenario that share its shape, so only the first of them pays for starting it:
    ``runtime`` says which this was."""

    executor_start_s: float         # the whole executor.start() (as repeats[].executor_start_s)
    runtime: str = "none"           # "started" for this variant, "reused", or "none" (no runtime)
    runtime_start_s: float = 0.0    # bringing the runtime up (0 when reused)
    warm_s: float = 0.0             # warming producers: start()'s part plus prepare()'s pass
    parts: dict[str, float] = field(default_factory=dict)   # the executor's own breakdown


# ------------------------------------------------------------------ profile (issue 23)

@dataclass
class ProfileStage:
    """A stage timed inside a profiled job's producers (or its trainer with 0 workers):
    ``dataset.__getitem__`` / ``dataset.__iter__`` (the items of each batch), ``collate_fn``,
    ``pin_memory``, or a ``stallbench.stage`` name. Sums over the run; ``cpu_s`` is the CPU
    clock of the thread that ran it."""

    name: str
    where: str                      # "workers" or "trainer"
    calls: int
    wall_s: float
    cpu_s: float


@dataclass
class ProfileLoader:
    """One loader stream of a profiled job on one rank (a DataLoader, a Ray Data iterator or a
    ``stallbench.watch``ed iterable), named by its dataset class and creation order
    (``ParquetDataset#0``); medians over repeats. ``wait_s``: the loop blocked in the
    loader's ``__next__`` (from ``iter()`` for each epoch's first batch: worker start-up is
    in it); ``step_s``: time between a batch's return and the next request (the loop's own
    work); ``epoch_s`` = wait + step, summed over the epochs (time between epochs is not the
    loader's)."""

    name: str
    kind: str                       # its door's kind (profile/agent/doors/): "torch.DataLoader"
    rank: int
    headline: bool                  # the loader that yielded the most batches
    settings: dict[str, Any]        # as the job's loader ran (overrides applied)
    epochs: int
    batches: int
    samples: int
    epoch_s: float
    wait_s: float
    step_s: float
    wait_share: float | None        # wait_s / epoch_s; None: a producer thread's (no loop's)
    time_to_first_batch_s: float
    batches_s: float
    samples_s: float
    steady_samples_s: float | None = None
    steady_wait_share: float | None = None
    stages: list[ProfileStage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gpu_wait_s: float | None = None     # CUDA events: the GPU idle between the batch boundaries
    gpu_step_s: float | None = None
    # the ``--set`` groups that reach it ("dataloader", "ray", "torch"), as its door declares:
    # what analysis asks (a knob that reached no loader is never advice) without the table
    set_keys: list[str] = field(default_factory=list)
    # the Ray node its process ran on (``<ip>/<node id, 8 hex>``), "" outside Ray (issue 56)
    node: str = ""


@dataclass
class ProfileNode:
    """One node of a multi-node job (torchrun ``--nnodes`` > 1, one ``stallbench profile``
    per node) in one variant: its host, the ranks its figures hold, in how many of the
    variant's runs they came, and how (``via``: "this node" for node rank 0, "endpoint" or
    "shared --out"). ``missing``: "" when it brought its figures in every run, else why not in
    the last run that lacked them ("no figures: its processes ended without writing",
    "no figures: never reported within 120 s ..."): such a node's ranks are absent from the
    rank and loader tables, and the result says so rather than look whole. ``wait_s``: the
    most one of its ranks waited for its batches (median over the runs), the figure that
    compares nodes; every figure here is a duration measured on the node itself (no clock of
    one machine is compared with another's)."""

    node: int
    host: str = ""
    ranks: list[int] = field(default_factory=list)
    runs: int = 0                   # runs whose figures it brought
    of_runs: int = 0                # the variant's runs
    via: str = ""
    missing: str = ""
    wait_s: float = math.nan
    exit_code: int = 0              # its job's exit code in the last run (0 when all were 0)
    cores: float = 0.0              # the cores its ranks ran on (its launcher's affinity)


@dataclass
class ProfileAblation:
    """One ablation of ``stallbench profile --analyze`` (``profile.ablate``): a run of the
    job with one part of its data path served from memory instead of computed."""

    name: str                       # the ablation's name (differential's: "compute_only", ...)
    removes: str                    # what it takes out of the run, in words
    done: bool
    why: str = ""                   # why it could not be done (never a guessed figure then)
    runs: int = 0
    epoch_s: Summary | None = None          # whole run over repeats (compute-only: extrapolated)
    steady_epoch_s: Summary | None = None   # steady state over repeats (the differential's)
    # a ``stallbench.stage`` served alone: full - this run, and the part it maps to
    # ("fetch", "preprocess", "transfer", or the user's own name)
    stall_s: float | None = None
    stall_interval: Interval | None = None
    part: str = ""


@dataclass
class ProfileAnalysis:
    """What ``--analyze`` did to one variant and what it found beyond ``attribution``."""

    method: str                     # in words
    keep_batches: int               # batches the compute-only run kept per loader
    budget_mb: float                # memory budget of the kept/recorded outputs per process
    ablations: list[ProfileAblation] = field(default_factory=list)
    # full - compute-only, steady state where both have it (whole runs otherwise)
    data_stall_s: float | None = None
    data_stall_interval: Interval | None = None
    compute_only_step_s: float | None = None    # per batch, served from memory (median of runs)
    transfer_note: str = ""         # where the host->device copy is counted
    stage_map: dict[str, str] = field(default_factory=dict)   # stage name -> attributed part
    notes: list[str] = field(default_factory=list)
    # issue 39: how ``budget_mb`` was reached, in words (a share of the machine's available
    # memory when the analysis started, per recording process)
    budget_basis: str = ""


@dataclass
class StallSeries:
    """One loader on one rank over time (``profile --live``, issue 60): per window of the
    grid (``StallOverTime.width_s``), its start (Unix seconds), the batches returned in it and
    their samples, the seconds the loop waited and stepped in it (a wait spanning windows is
    split by time), the wait of passes' first batches (start-up) and the longest single
    wait. Windows in which nothing happened are left out."""

    loader: str
    rank: int
    node: str = ""
    start_unix_s: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    wait_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    startup_wait_s: list[float] = field(default_factory=list)
    max_wait_s: list[float] = field(default_factory=list)


@dataclass
class StallOverTime:
    """When and where the job waited (``profile --live``): one ``StallSeries`` per loader and
    rank on one grid of ``width_s`` seconds (the base window doubled as often as a long job
    needed to keep at most ``max_windows``), so the result's size follows the windows kept,
    never the batches."""

    width_s: float
    max_windows: int
    series: list[StallSeries] = field(default_factory=list)
    rule: str = ""


@dataclass
class ProfileVariant:
    """What ``stallbench profile`` measured of one variant beyond the headline loader's
    figures (which are the variant's ``repeats``)."""

    loaders: list[ProfileLoader]
    exit_code: int = 0
    ended_early: str = ""           # the job ended before its loader finished an epoch (why)
    capped: bool = False            # --max-batches ended the epochs
    analysis: ProfileAnalysis | None = None   # --analyze: the ablation runs (issue 28)
    nodes: list[ProfileNode] = field(default_factory=list)   # issue 56: [] on one machine
    over_time: StallOverTime | None = None     # issue 60: --live's windows; None without


@dataclass
class ProfileCommand:
    """The profiled command, as recorded (secret-looking values redacted, ``profile.redact``)."""

    argv: list[str]
    cwd: str
    environment: dict[str, str]     # the variables that shape the run, redacted
    torch: str | None
    ray: str | None
    hooks_written_for: dict[str, str]
    world_size: int = 1
    nodes: int = 1


@dataclass
class VariantResult:
    name: str
    knobs: dict[str, Any]           # the matrix values that make this variant
    config: dict[str, Any]          # the fully resolved scenario config it ran with
    emulated: list[str]             # config keys whose figures come from an emulation
    executor: ExecutorFacts
    throughput_samples_s: Summary
    epoch_s: Summary
    stall_s: Summary
    stall_share: Summary            # stall_s / epoch_s per repeat
    time_to_first_batch_s: Summary
    peak_pss_mb: Summary
    repeats: list[RepeatFigures]
    stage_rates: StageRates = field(default_factory=StageRates)
    trainer_solo: TrainerSolo | None = None
    bytes: ByteFigures = field(default_factory=ByteFigures)
    ablations: dict[str, list[RepeatFigures]] = field(default_factory=dict)   # by ablation name
    attribution: Attribution | None = None
    notes: dict[str, str] = field(default_factory=dict)   # knobs that had no effect here, why
    timeline: Timeline = field(default_factory=Timeline)      # first full repeat
    resources: Resources = field(default_factory=Resources)   # first full repeat
    # trainers.ranks > 1: the ranks and the straggler (None for one in-process trainer)
    ranks: RankSummary | None = None
    startup: StartupFigures | None = None                     # issue 16
    threads: ThreadBudget | None = None     # thread budgets as resolved (None: older results)
    device: DeviceFigures | None = None      # AU, H2D copies (issue 15)
    phases: PhaseSummary | None = None                 # start-up vs steady state (issue 14)
    recommendation: Recommendation | None = None       # the next change to try
    profile: ProfileVariant | None = None    # stallbench profile: every loader (issue 23)


# ---------------------------------------------------------------------- what-if (analysis)

@dataclass(frozen=True)
class WhatIfModel:
    """The bottleneck model's inputs, fitted on one measured variant (``analysis.whatif``
    holds the formulas). Per sample the trainer consumes, in seconds."""

    p_wall: float
    p_cpu: float
    t_trainer: float
    t_cpu: float
    cores: float                 # cores of the machine the fit ran on
    stage_wall: dict[str, float]  # per-sample wall time per stage, trainer-side parts and
    #                               "compute_only" (the step alone: analysis.figures); explanations
    io_wait: float               # per-sample storage wait inside p_wall
    io_bytes: float              # storage bytes per sample
    compute: float               # compute seconds per sample (inside t_trainer)
    fit_workers: int
    fit_variant: str
    cpus_per_node: int = 1
    p_extra: float = 0.0         # per-sample producer time outside the stage timers (N >= 1)
    t_extra: float = 0.0         # per-sample trainer time outside its measured parts
    cores_scale: float = 1.0     # share of the cores the CPU work actually got
    startup_s: float = 0.0       # measured time to first batch at the fit
    calibration: str = ""
    p_solo: float | None = None
    solo_item_s: float | None = None
    ranks: int = 1               # data-parallel trainer ranks at the fit (t_trainer is per rank)
    producers_per_rank: bool = True   # each rank has its own workers (local) or one pool (Ray)
    # "shared": producers share `cores` (local workers, simulated nodes); "own": every
    # producer slot brings a core of its own (real nodes on other machines), so the CPU
    # budget at N slots is cores + N (issue 16)
    producer_cores: str = "shared"
    # --- issue 17: which model this is, its contention terms and the run's work items
    kind: str = "one-point"      # the registered what-if model that made it ("contention")
    fit_variants: list[str] = field(default_factory=list)   # every variant the fit used
    # per-sample cost growth per extra busy core, relative to one busy core (0: none)
    contention_producer: float = 0.0
    contention_trainer: float = 0.0
    startup_per_worker_s: float = 0.0   # time to first batch added per producer beyond the fit's
    item_rows: float = 0.0       # samples per work item (row group); 0: unknown (fluid only)
    batch_rows: float = 0.0      # samples per batch
    start_fixed_s: float = 0.0   # start-up before the first item begins (forks, runtime)
    contention_fit: str = ""     # how the contention terms were fitted, in words
    # the data stage the fit variant's conclusive attribution names bound ("": none; the
    # explanations then name the heaviest by the stage timers): ``figures.named_stage``
    bound_stage: str = ""


@dataclass
class WhatIfPoint:
    """One PREDICTED configuration."""

    n: int
    predicted_samples_s: float
    stall_share: float
    bound_by: str
    why: str
    binding: str = ""            # the model term that binds: workers, cores, trainer, storage
    model: str = ""              # the what-if model that made it ("one-point", "contention")
    # prediction interval of the steady rate from the back-test (None: no back-test)
    low_samples_s: float | None = None
    high_samples_s: float | None = None
    # issue 39: why the model's figure is not given (its back-test missed by more than
    # ``backtest.MAX_ERROR``, or reaches no count this far); "" when predicted
    not_predicted: str = ""


@dataclass
class WhatIfCheck:
    """A measured configuration against the prediction for it."""

    n: int
    variant: str
    measured_samples_s: float
    predicted_samples_s: float
    predicted_run_samples_s: float | None = None
    error: float | None = None
    measured_steady_samples_s: float | None = None
    steady_error: float | None = None
    is_fit: bool = False
    bound_by: str = ""
    ranks: int = 1               # the measured variant's data-parallel ranks
    # more producer slots than the cores they share: a point that measures contention the
    # model does not have; kept, but left out of max_abs_error (issue 16)
    oversubscribed: bool = False
    model: str = ""              # the what-if model that made the prediction
    # the steady figure a run measures (after its first batch), replayed item by item
    predicted_steady_samples_s: float | None = None


@dataclass
class BackTestPoint:
    """One measured configuration predicted by a fit that did not see it."""

    n: int
    variant: str
    model: str                   # the model the other points allowed
    fitted_on: list[str]         # the variants that fit used
    measured_samples_s: float    # whole run (epoch throughput), median of repeats
    predicted_run_samples_s: float
    error: float | None          # (predicted - measured) / measured, whole run
    measured_steady_samples_s: float | None = None
    predicted_steady_samples_s: float | None = None
    steady_error: float | None = None
    # the interval made from the OTHER points' residuals, and whether this point fell in it
    interval_low_samples_s: float | None = None
    interval_high_samples_s: float | None = None
    covered: bool | None = None
    ranks: int = 1               # the point's data-parallel ranks (issue 18)
    oversubscribed: bool = False   # shown, not counted in the errors or the interval (issue 16)
    # how far ``n`` lies outside the producer counts the fit saw (issue 25: a prediction's
    # interval comes from back-tests at the same or a larger extrapolation): ``extrapolation``
    # producers ``direction`` "above" the largest or "below" the smallest; 0 and "" between
    extrapolation: int = 0
    direction: str = ""


@dataclass
class BackTest:
    """Leave-one-out back-test of a scaling curve (``analysis.backtest`` has the method)."""

    method: str                  # in words
    points: list[BackTestPoint]
    max_abs_error: float | None = None
    mean_abs_error: float | None = None
    max_abs_steady_error: float | None = None
    mean_abs_steady_error: float | None = None
    interval_level: float | None = None       # the level the interval is built for
    interval_log_half_width: float | None = None   # steady: predicted x exp(+-w)
    interval_run_log_half_width: float | None = None   # whole run
    coverage: float | None = None             # share of checked points inside their interval
    covered: int = 0
    checked: int = 0
    # issue 25: the same leave-one-out with every OTHER model the remaining points can fit
    # (``points`` hold the richest one's, which the figures above summarise), so a
    # prediction can be made by the model whose back-test is best where it extrapolates
    alternatives: list[BackTestPoint] = field(default_factory=list)
    # issue 39: the widest half log range of one point's repeats (steady rates): no interval
    # is narrower than a measurement repeats (None: fewer than two repeats anywhere)
    repeat_log_half_width: float | None = None


@dataclass
class Knee:
    n: int | None
    bound_by: str | None
    explanation: str
    saturates_at: int | None = None
    # issue 39: the knee's count was not measured and its prediction is not given (the
    # point's ``not_predicted``): no advice is made from it
    not_predicted: str = ""


@dataclass
class KneeAdvice:
    """What ``profile`` advises about the knee, decided once in ``analysis.knee`` (issue 39:
    the printer used to decide it) and stored so every reader sees the same advice. ``action``:
    "none" (no knee), "measure" (no figure to compare: the knee is not predicted or no
    variant had a steady rate), "keep" (a measured variant is as fast or faster), "set" (the
    knee was measured and is the best), "try" (PREDICTED faster, its back-test vouching)."""

    action: str
    n: int | None = None                # the knee's worker count
    reason: str = ""                    # why, in words (the knee's explanation or what is missing)
    best_variant: str = ""              # the best measured variant (steady rate where any had one)
    best_n: int | None = None
    best_rate: float = math.nan         # MEASURED, ``rate_basis`` says which rate
    rate_basis: str = ""
    knee_variant: str = ""              # where the knee itself was measured
    knee_rate: float = math.nan         # MEASURED at the knee
    predicted_gain: float = math.nan    # PREDICTED knee rate / best measured rate
    predicted_gain_low: float = math.nan    # the back-test's interval of it
    predicted_gain_high: float = math.nan


@dataclass
class WhatIfValidation:
    label: str                   # always "predicted"
    axis: str
    fit_variant: str
    model: WhatIfModel
    points: list[WhatIfPoint]
    measured: list[WhatIfCheck]
    knee: Knee
    max_abs_error: float | None = None
    max_abs_steady_error: float | None = None
    note: str = ""
    backtest: BackTest | None = None    # every measured point predicted without it
    advice: KneeAdvice | None = None    # profile's knee advice (issue 39, ``analysis.knee``)


@dataclass
class ScenarioAnalysis:
    baseline_variant: str | None = None
    best_variant: str | None = None
    # the best variant's median whole-run samples/s over the baseline's (``analysis.summary.
    # whole_run_speedup``); the steady ratio is the variants' ``phases``
    best_speedup: float | None = None
    verdict: str = ""
    whatif: WhatIfValidation | None = None
    recommendation: Recommendation | None = None   # the scenario's top one (issue 14)


# ------------------------------------------------------------------------- the whole file

@dataclass
class ToolInfo:
    name: str
    version: str


@dataclass
class ScenarioInfo:
    name: str
    path: str
    sha256: str
    fingerprint: str             # what must match for two runs to be comparable
    text: str                    # the scenario file as it ran
    matrix: dict[str, Any]
    description: str = ""


@dataclass
class GpuInfo:
    name: str
    memory_mb: float


@dataclass
class GitInfo:
    commit: str
    dirty: bool


@dataclass
class MachineInfo:
    hostname: str = ""
    cpu_model: str = ""
    cores_logical: int | None = None
    cores_physical: int | None = None
    cpu_affinity: int | None = None
    memory_gb: float | None = None
    os: str = ""
    python: str = ""
    libraries: dict[str, str | None] = field(default_factory=dict)
    gpu: list[GpuInfo] | None = None
    git: GitInfo | None = None
    load_avg_at_start: list[float] | None = None

    @property
    def cores(self) -> float:
        """Cores this process could use when it ran (affinity first)."""
        return float(self.cpu_affinity or self.cores_logical or 1)


@dataclass
class RunSettings:
    repeats: int
    argv: list[str] = field(default_factory=list)
    max_batches_override: int | None = None
    cache_dir: str = ""


@dataclass
class DatasetInfo:
    source: str = ""
    synthetic: bool = False
    files: int = 0
    rows: int = 0
    shards: int = 0
    compressed_bytes: int = 0
    uncompressed_bytes: int = 0
    dense_columns: int = 0
    sparse_columns: int = 0
    sequence_columns: int = 0
    label: str = ""
    seq_len: int = 0
    cardinality: int | None = None
    dataset_key: str | None = None


# ------------------------------------------------------- tune of the user's job (issue 41)

@dataclass
class JobTrial:
    """One configuration ``stallbench tune -- CMD`` ran: the job as written (first), then each
    searched configuration once. ``settings``: what the trial set on the job, as the user
    writes it (bare loader keywords, ``{"num_workers": 2, "persistent_workers": true}``;
    other knobs prefixed, ``torch.num_threads``); ``{}`` for the job as written.

    ``steady_samples_s``: samples/s of the headline loader from the start of its second epoch
    to the end of the trial, each epoch's start-up included (a worker forked per epoch pays
    it every epoch); where the trial saw one epoch only, the rate of its steady window
    (``rate_basis`` says which). Measured, never a whole-run time a shortened job distorts."""

    name: str                    # the variant's name in ``variants`` ("default" as written)
    settings: dict[str, Any]
    why: str                     # the figure, measured in an earlier trial, that chose it
    outcome: str                 # "measured"; "failed" (the job exited non-zero under it);
                                 # "not_applied" (the job overrode it: torch's threads)
    steady_samples_s: float = math.nan
    rate_basis: str = ""         # "epochs 2-5 (4 epochs, start-up included)" or "steady window"
    steady_wait_share: float = math.nan    # the loop's wait over the same span
    step_s: float = math.nan     # the loop's median step over the same span
    batches: int = 0             # batches of the headline loader the trial ran
    epochs: int = 0              # its epochs that ended
    ended_by_tune: str = ""      # why tune ended the job early ("" it ran to its end)
    exit_code: int = 0
    wall_s: float = 0.0
    predicted_samples_s: float | None = None   # PREDICTED before it ran (the what-if's knee)
    foreign_cores: float | None = None    # cores other processes kept busy meanwhile


@dataclass
class JobTuneBest:
    """The answer: the best trial, measured again interleaved with the job as written.
    ``speedup`` = its steady rate over the job as written (medians of every run of both);
    ``speedup_low``/``speedup_high``: the range of its ratio over the pairs (its search trial
    with the job as written's, then each confirmation round's, run side by side); none from
    one pair. A best that the confirmation does not hold up (under 3%, or a pair slower) is
    not the answer: ``settings`` fall back to the job as written and ``stop_text`` says so;
    ``ceiling_share`` = its steady rate / the compute-only steady rate (the most a loader
    setting can buy, by replay)."""

    name: str
    settings: dict[str, Any]
    steady_samples_s: float
    speedup: float
    ceiling_share: float | None
    stop_reason: str             # "at_ceiling", "no_gain_predicted", "budget", "baseline_failed"
    stop_text: str               # the reason in words, with its figures
    speedup_low: float | None = None       # the range over the pairs
    speedup_high: float | None = None
    confirm_runs: int = 0        # confirmation rounds that measured both sides (also when
                                 # the best was not confirmed and the answer fell back)
    still_binds: str = ""        # what still binds, from the last evidence
    apply: str = ""              # the settings as the user writes them in code
    # issue 58: "keep" with no setting measured (the budget spent on the job and its
    # ceiling) is not an answer; the rates' basis in words; the whole job's ratio (its first
    # epoch included), measured where both runs ran to the end, else ESTIMATED from their
    # epochs (``whole_job_basis`` says which; None: the job's epoch count is unknown)
    answered: bool = True
    basis: str = ""
    whole_job_speedup: float | None = None
    whole_job_basis: str = ""


@dataclass
class JobTune:
    """``stallbench tune -- CMD``: the search on the user's job, its ceiling and its answer."""

    budget_s: float
    wall_s: float
    loader_kind: str             # the headline loader's kind ("torch.DataLoader", ...)
    loader_name: str
    as_written: dict[str, Any]   # the headline loader's own settings as the job made it
    cores: float                 # the machine's cores the search budgeted workers within
    ceiling_samples_s: float | None   # compute-only steady rate (replay), None: not measured
    ceiling_note: str            # how the ceiling was measured, or why not
    trials: list[JobTrial]
    best: JobTuneBest | None
    runs: int                    # every run of the job the tune made (ceiling, confirmation)
    trial_batches: int | None = None
    keys: list[str] = field(default_factory=list)   # the settings it was allowed to change


@dataclass
class Result:
    schema_version: int
    tool: ToolInfo
    created_utc: str
    scenario: ScenarioInfo
    machine: MachineInfo
    settings: RunSettings
    dataset: DatasetInfo
    variants: list[VariantResult]
    analysis: ScenarioAnalysis = field(default_factory=ScenarioAnalysis)
    status: str = "complete"
    profile: ProfileCommand | None = None    # stallbench profile: the command (issue 23)
    tune: JobTune | None = None     # stallbench tune -- CMD: the search on the job (issue 41)

    def variant(self, name: str) -> VariantResult:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)


# --------------------------------------------------------------------- tune (issue 17)

@dataclass
class TuneFigures:
    """What one measured configuration gave during ``stallbench tune`` (medians of its repeats).
    ``steady_stall_share`` = 1 - steady rate x compute seconds per sample: the share of the
    steady state the trainer is not computing, the figure "stall-free" (< 5%) is judged on,
    because a short run's start-up alone can be 5% of its epoch."""

    throughput_samples_s: float
    steady_throughput_samples_s: float
    epoch_s: float
    samples: int
    stall_share: float
    steady_stall_share: float
    time_to_first_batch_s: float
    producer_slots: int
    cpu_nodes: int               # producer nodes a price applies to (0: on the trainer's node)
    bound_by: str                # attribution's bound, or the what-if's reading of the run
    bound_from: str              # "attribution" or "what-if"
    cost_per_epoch: float | None = None   # with prices: one pass over the dataset
    repeats: int = 1             # runs these figures are the medians of
    # runs measured but not counted above: 1 where the executor keeps the workers
    # (``ExecutorFacts.workers_kept``), whose first run forks them: a training job pays that
    # once, not every epoch, so the configuration is judged on the runs after it
    runs_not_counted: int = 0


@dataclass
class TuneStep:
    """One configuration ``tune`` tried (or skipped), why, and what it gave."""

    step: int
    variant: str                 # named from the knobs that differ from the base scenario
    knobs: dict[str, Any]        # every knob that differs from the base scenario
    change: str                  # what this step changed, "loader.num_workers: 0 -> 2"
    why: str                     # the reason, from the attribution and the what-if
    outcome: str                 # "baseline", "better", "not better", "skipped"
    predicted_samples_s: float | None = None     # whole run, PREDICTED before measuring
    predicted_by: str = ""       # the what-if model that predicted it ("" none)
    measured: TuneFigures | None = None
    error: float | None = None   # (predicted - measured) / measured
    wall_s: float = 0.0          # time the step took, set-up included
    foreign_cores: float | None = None   # cores other processes kept busy meanwhile


@dataclass
class TuneRecommendation:
    variant: str
    knobs: dict[str, Any]
    scenario_path: str           # the scenario file written: the base plus these knobs
    stall_free: bool
    why: str
    measured: TuneFigures        # from the search
    predicted_samples_s: float | None = None     # what the confirmation run should give
    predicted_by: str = ""       # what-if model, or "search run" (its own measurement)


@dataclass
class TuneConfirmation:
    """A fresh measured run of the written scenario file."""

    result_path: str
    measured: TuneFigures
    predicted_samples_s: float | None
    error: float | None          # (predicted - measured) / measured
    within_goal: bool | None     # |error| <= 10%
    foreign_cores: float | None = None   # cores other processes kept busy meanwhile


@dataclass
class TuneResult:
    """``stallbench tune``: the search, the recommendation and its confirmation. Saved like a
    run's result (atomically) under ``tune/`` of the result directory, so the directory's
    run results stay one kind of file."""

    schema_version: int
    kind: str                    # "tune"
    tool: ToolInfo
    created_utc: str
    scenario: ScenarioInfo
    machine: MachineInfo
    budget_s: float
    wall_s: float
    cpu_node_cost: float | None
    gpu_node_cost: float | None
    steps: list[TuneStep]
    stopped_because: str
    recommendation: TuneRecommendation | None = None
    confirmation: TuneConfirmation | None = None
    # cores other processes kept busy during the whole tune: the what-if assumes none
    foreign_cores: float | None = None
