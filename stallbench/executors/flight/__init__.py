"""Disaggregated execution over real sockets: producers are Apache Arrow Flight servers.

Yelp's ArrowStreamServer, as an executor: each server owns a share of the row groups, fetches
and preprocesses them with stallbench's own producer code and streams the trainer's batches as
Arrow record batches (IPC compression zstd or none, as ``loader.compression`` says); the
trainer reads several streams at once and turns the buffers into tensors without row-wise
Python. Split by concern:

- ``driver``: ``FlightExecutor``, the trainer's side (servers, shares, readers, the merge);
- ``server``: the Flight server (``stallbench serve``, and the local servers' entry point);
- ``local``: servers started on the trainer's machine, and their end;
- ``protocol``: tickets, actions and batch metadata (JSON; nothing on the socket is pickled);
- ``auth``: who may call a server, and what (bearer tokens checked on every call; the
  trainer that started a local server is its owner, ``serve``'s token holders are readers);
- ``link``: the bytes that crossed the link, from the kernel's socket counters.

Flight is imported only where it is used, so this package imports without it.
"""

from .driver import FlightExecutor

__all__ = ["FlightExecutor"]
