"""The Flight trailer is JSON on the wire: every field of ``StageTimes`` must come back as the
type the trainer adds up, nested records included (the sequences a padded format cut arrived
as a dict and broke the run's totals when issue 15's counts met issue 20's protocol)."""

from __future__ import annotations

import pytest

from stallbench.executors.flight.protocol import ProtocolError, Trailer, decode_meta
from stallbench.pipeline import StageTimes
from stallbench.stages.batch_format import SequenceCounts


def test_trailer_round_trips_stage_times_with_sequence_counts() -> None:
    seqs = SequenceCounts(seq_len=4, sequences=10, cut=3, ids=50, ids_cut=7, longest=9)
    t = Trailer(item=2, shard=5, parts=1, batches=3, rows=300, payload=True,
                times=StageTimes(fetch_s=0.5, rows_in=300, sequences=seqs))
    back = decode_meta(t.encode())
    assert isinstance(back, Trailer)
    assert back == t and isinstance(back.times.sequences, SequenceCounts)


def test_trailer_with_unknown_sequence_keys_is_a_protocol_error() -> None:
    raw = Trailer(0, 0, 1, 1, 1, True).encode().replace(
        b'"sequences": null', b'"sequences": {"seq_len": 4, "bogus": 1}')
    with pytest.raises(ProtocolError, match="sequence counts"):
        decode_meta(raw)
