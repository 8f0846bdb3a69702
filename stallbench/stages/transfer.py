"""Transfer: everything between a preprocessed table and a batch on the trainer's device.

Producer side (``Transfer.send``): split into batches, encode in the batch format, optionally
compress with zstd, and, when ``wire_bandwidth_mb_s`` is set, wait as long as an EMULATED link
would take to carry the bytes. A format that pads sequences also counts the ids it cuts.
Trainer side: ``receive_host`` decompresses and decodes/collates on the host; the device path
(``stages.device``: pinned staging by a pin thread, the copy, preload on a side stream) takes
it from there when the trainer's device is a GPU. ``receive`` is the plain serial form of both
(decode, then a blocking copy), for callers that want one batch on the device. Both halves
are timed as transfer.

Where the trainer-side work runs (``receive_thread_depth``): in the trainer thread by default;
in one receive thread keeping N batches ready with ``loader.prefetch_batches = N``; and always
in that thread (the pin thread, N at least 1) with ``pin_memory`` on a GPU, so decompression,
decoding and pinning never sit on the trainer thread, which only launches the copy.

Compression applies to what the producer hands over, whether or not that crosses a process
boundary (with ``num_workers = 0`` it does not, and results say so with ``ipc_bytes = 0``):
its CPU cost is real either way, and with an emulated link it is what shrinks the wait.

Copies are avoided where they would cost a pass over the batch: a single buffer is compressed
straight from its memory (no ``tobytes``) and decompressed straight into a preallocated tensor
(no intermediate ``bytes`` + ``bytearray``); every zstd frame carries a checksum, so a damaged
frame is an error naming the batch, never a garbage tensor.
"""

from __future__ import annotations

import os
import pickle
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import torch
import zstandard

from ..data.schema import FeatureSchema
from ..errors import PayloadError
from ..scenario import LoaderSpec
from .batch_format import (BatchFormat, LocalBatch, SequenceCounts, TensorBatch, format_class,
                           nbytes)
from .buffers import PooledBuffer, SlotAllocator
from .costs import precise_wait
from .device import DeviceApi, cuda_api

# A frame header claiming more than this is corrupt, not a batch: refuse before allocating.
MAX_DECOMPRESSED_BYTES = 1 << 34


@dataclass
class Payload:
    """One batch in flight between producer and trainer."""

    batch_id: str
    rows: int
    data: Any
    compressed: bool
    wire_bytes: int      # bytes handed over (compressed size when compressed)
    raw_bytes: int       # bytes of the encoded batch before compression
    # ``data`` is already the trainer's TensorBatch (Ray's iter_torch_batches; with 0 loader
    # workers, a ``LocalBatch``'s tensors): nothing to decode.
    final: bool = False
    sequences: SequenceCounts | None = None   # what padding cut (formats that pad sequences)
    # The batch format that encoded ``data`` when it is not the loader's (an executor whose
    # wire has a format of its own: Flight streams ``arrow`` record batches).
    format: str | None = None
    # ``data`` lives in a slot of a ``BufferPool`` (a ``PooledBuffer``, or a ``LocalBatch``'s
    # tensors over a trainer-local slot): counted in results as pooled batches.
    pooled: bool = False


def device() -> torch.device:
    """The trainer's device: CUDA when present, else CPU (GPU paths are never required)."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


_ZSTD = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """One compressor per thread and level: contexts are costly to create, not thread-safe,
    and cannot be pickled (so they are never part of a ``Transfer`` shipped to a worker)."""
    cache = getattr(_ZSTD, "c", None)
    if cache is None:
        cache = _ZSTD.c = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_checksum=True,
                                                write_content_size=True)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_ZSTD, "d", None)
    if d is None:
        d = _ZSTD.d = zstandard.ZstdDecompressor()
    return d


def as_numpy(obj: Any) -> Any:
    """Tensors -> numpy views (in dicts and lists too) before pickling: numpy pickles its data
    in one flat copy, torch through a slower storage serialiser. ``BatchFormat.decode``
    accepts either. Both wires (this stage's and the Ray codec's) pickle through here."""
    if isinstance(obj, torch.Tensor):
        return obj.numpy()
    if isinstance(obj, dict):
        return {k: as_numpy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [as_numpy(v) for v in obj]
    return obj


def compress_buffer(buf: torch.Tensor, level: int) -> bytes:
    """zstd frame of a flat uint8 tensor, read in place."""
    return _compressor(level).compress(memoryview(buf.numpy()))


def decompress_buffer(frame: Any, batch_id: str) -> torch.Tensor:
    """Decompress one zstd frame into a fresh, writable uint8 tensor (one pass, no copies).

    The frame's content size sizes the output; the checksum is verified as the stream ends;
    a short frame, trailing bytes or any zstd error is a ``PayloadError`` naming the batch.
    """
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise PayloadError(f"batch {batch_id}: zstd frame is corrupt ({exc})") from None
    if size < 0 or size > MAX_DECOMPRESSED_BYTES:
        raise PayloadError(f"batch {batch_id}: zstd frame header is corrupt "
                           f"(content size {size})")
    out = torch.empty(size, dtype=torch.uint8)
    view = memoryview(out.numpy()) if size else memoryview(bytearray())
    try:
        reader = _decompressor().stream_reader(frame, read_across_frames=False)
        got = 0
        while got < size:
            k = reader.readinto(view[got:])
            if not k:
                break
            got += k
        trailing = reader.read(1)
    except zstandard.ZstdError as exc:
        raise PayloadError(f"batch {batch_id}: zstd frame is corrupt ({exc})") from None
    if got != size:
        raise PayloadError(f"batch {batch_id}: zstd frame is truncated ({got} of {size} bytes)")
    if trailing:
        raise PayloadError(f"batch {batch_id}: zstd frame has trailing data")
    return out


class Transfer:
    def __init__(self, loader: LoaderSpec, schema: FeatureSchema) -> None:
        self.loader = loader
        self.schema = schema
        self.format: BatchFormat = format_class(loader.batch_format)(schema, loader.collate)
        self._formats: dict[str, BatchFormat] = {loader.batch_format: self.format}
        self.level = loader.compression_level
        self.compress = loader.compression == "zstd"
        self.device = device()
        self.pin = loader.pin_memory and self.device.type == "cuda"
        self.device_prefetch = loader.device_prefetch if self.device.type == "cuda" else 0
        self._api: DeviceApi | None = None

    @property
    def api(self) -> DeviceApi | None:
        """The trainer's device operations (CUDA), None on a CPU trainer."""
        return self._api if self._api is not None else cuda_api(self.device)

    def attach(self, api: DeviceApi) -> None:
        """Run the device path against ``api`` instead of CUDA (tests drive it on the CPU
        with a fake that defers copies), as if the trainer had that device."""
        self._api = api
        self.pin = self.loader.pin_memory
        self.device_prefetch = self.loader.device_prefetch

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_api"] = None          # device handles stay in the trainer's process
        return state

    @property
    def receive_threads(self) -> int:
        """Payloads the receive thread decompresses and decodes at once. One, unless batches
        arrive compressed and there is a receive thread: then up to 4 (a quarter of the
        cores this process may use), since zstd runs without the GIL and one thread's
        decompression rate would otherwise cap the stream (28 ms per 9 MB batch measured on
        an H100 host)."""
        if not self.compress or not self.receive_thread_depth:
            return 1
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:           # not Linux
            cores = os.cpu_count() or 1
        return max(1, min(4, cores // 4))

    @property
    def receive_thread_depth(self) -> int:
        """Batches the receive (pin) thread keeps ready; 0: the trainer thread receives."""
        if self.loader.prefetch_batches:
            return self.loader.prefetch_batches
        return 1 if self.pin else 0

    # --------------------------------------------------------------------- producer side
    def split(self, table: pa.Table) -> list[pa.Table]:
        b = self.loader.batch_size
        return [table.slice(i, b) for i in range(0, table.num_rows, b)]

    def send_table(self, table: pa.Table, prefix: str, shared: bool | SlotAllocator,
                   emulate_wire: bool = True, local: bool = False) -> list[Payload]:
        """Every batch of one preprocessed table (ids ``prefix:i``), as ``send`` would make
        them one by one; the format encodes the whole table at once where it can
        (``BatchFormat.encode_table``). ``local``: the payloads stay in this process (0
        loader workers): unless they are compressed (whose CPU cost is what a compressed
        variant measures), a format that can hands over the model's tensors directly
        (``LocalBatch``: a final payload, nothing to decode)."""
        local = local and not self.compress
        encoded = (self.format.encode_table(table, self.loader.batch_size, prefix,
                                            False if self.compress else shared, local)
                   if not self.format.pads_sequences else None)
        if encoded is None:
            return [self.send(b, f"{prefix}:{i}", shared, emulate_wire)
                    for i, b in enumerate(self.split(table))]
        return [self._local(f"{prefix}:{i}", rows, data, emulate_wire)
                if isinstance(data, LocalBatch) else
                self._payload(f"{prefix}:{i}", rows, data, None, emulate_wire)
                for i, (rows, data) in enumerate(encoded)]

    def _local(self, batch_id: str, rows: int, lb: LocalBatch, emulate_wire: bool) -> Payload:
        """A ``LocalBatch`` as a final payload: its buffer's bytes are what was packed (and
        what an emulated link carries)."""
        if emulate_wire and self.loader.wire_bandwidth_mb_s:
            precise_wait(lb.nbytes / (self.loader.wire_bandwidth_mb_s * 1e6))
        return Payload(batch_id, rows, lb.batch, False, lb.nbytes, lb.nbytes, final=True,
                       pooled=lb.pooled)

    def send(self, table: pa.Table, batch_id: str, shared: bool | SlotAllocator,
             emulate_wire: bool = True) -> Payload:
        """Encode (+ compress, + emulated link wait) one batch. ``shared``: the payload will
        cross to another process (True, or the worker's ``BufferPool`` partition)."""
        # A compressed payload is a new bytes object anyway: no point in shared memory.
        data = self.format.encode(table, batch_id, False if self.compress else shared)
        cut = (SequenceCounts.of(table, self.schema)
               if self.format.pads_sequences and self.schema.sequence else None)
        return self._payload(batch_id, table.num_rows, data, cut, emulate_wire)

    def _payload(self, batch_id: str, rows: int, data: Any, cut: SequenceCounts | None,
                 emulate_wire: bool) -> Payload:
        """Compress (when asked) and wait out the emulated link: the rest of ``send``."""
        raw = nbytes(data)
        compressed = False
        if self.compress:
            if self.format.contiguous_buffer:     # compressed in place, no pickle
                data = compress_buffer(data, self.level)
            else:
                blob = pickle.dumps(as_numpy(data), protocol=pickle.HIGHEST_PROTOCOL)
                raw = len(blob)
                data = _compressor(self.level).compress(blob)
            compressed = True
        wire = nbytes(data)
        if emulate_wire and self.loader.wire_bandwidth_mb_s:
            precise_wait(wire / (self.loader.wire_bandwidth_mb_s * 1e6))
        return Payload(batch_id, rows, data, compressed, wire, raw, sequences=cut,
                       pooled=isinstance(data, PooledBuffer))

    # ---------------------------------------------------------------------- trainer side
    def receive(self, p: Payload) -> TensorBatch:
        """One batch on the trainer's device, serially (decode, then a blocking copy)."""
        return self.to_device(self.receive_host(p))

    def receive_host(self, p: Payload) -> TensorBatch:
        """Decompress and decode one payload into a host batch (device path not included)."""
        if p.final:
            return p.data
        data = p.data
        fmt = self.format_of(p)
        if p.compressed:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise PayloadError(f"batch {p.batch_id}: compressed payload is a "
                                   f"{type(data).__name__}, not bytes")
            if fmt.contiguous_buffer:
                data = decompress_buffer(data, p.batch_id)
            else:
                blob = decompress_buffer(data, p.batch_id).numpy()
                try:
                    data = pickle.loads(memoryview(blob))
                except Exception as exc:  # noqa: BLE001 - any unpickling failure is corruption
                    raise PayloadError(f"batch {p.batch_id}: payload does not unpickle "
                                       f"({exc})") from None
        return fmt.decode(data, p.batch_id, p.rows)

    def format_of(self, p: Payload) -> BatchFormat:
        """The format that decodes ``p``: the loader's, or the one the payload names."""
        if p.format is None:
            return self.format
        fmt = self._formats.get(p.format)
        if fmt is None:
            fmt = self._formats[p.format] = format_class(p.format)(self.schema,
                                                                   self.loader.collate)
        return fmt

    def to_device(self, batch: TensorBatch) -> TensorBatch:
        """A blocking copy of a host batch to the device (the measured path is
        ``stages.device``; this serves caches and the serial ``receive``)."""
        if self.device.type == "cpu":
            return batch
        return {k: v.to(self.device) for k, v in batch.items()}

    def notes(self) -> dict[str, str]:
        """Which requested knobs had no effect on this machine, said in results."""
        out = {}
        if self.loader.pin_memory and not self.pin:
            out["pin_memory"] = "no-op: no CUDA device on this machine"
        if self.loader.device_prefetch and not self.device_prefetch:
            out["device_prefetch"] = "no-op: no CUDA device on this machine (no copy to preload)"
        if self.device.type == "cpu":
            out["device_copy"] = "no-op: trainer device is the CPU"
        if self.compress and self.loader.num_workers == 0 and self.loader.wire_bandwidth_mb_s is None:
            out["compression"] = ("applied, but nothing crosses a process boundary with "
                                  "num_workers = 0: its CPU cost is measured, no bytes are saved")
        return out
