"""Samples in a batch, from its structure (``profile/agent/rows.py``, issue 57): the batches
the field tests miscounted, by construction (no job run): a ``BatchEncoding`` of 2 rows was
counted as 1 sample (samples/s 4.25 where the Trainer said 8.15), SPDL's ``aggregate(8)`` of
16-row images as 16."""

from __future__ import annotations

from collections import UserDict

import numpy as np
import torch

import profile_helpers as helpers


class BatchEncodingLike(UserDict):
    """As transformers' ``BatchEncoding``: a ``UserDict`` whose ``__getattr__`` looks the
    name up in its data and raises ``KeyError``'s cousin for anything else (issue 38: no
    code of a batch's class may run from the counting)."""

    def __getattr__(self, item):
        try:
            return self.data[item]
        except KeyError:
            raise AttributeError(item) from None

    def values(self):           # never called by the counting
        raise AssertionError("the batch's own values() ran")


def _rows():
    return helpers.load_agent("_agent_rows_57").rows.rows


def test_dict_likes_and_mappings_of_lists_count_their_rows() -> None:
    rows = _rows()
    enc = BatchEncodingLike({"input_ids": torch.zeros(2, 37, dtype=torch.long),
                             "attention_mask": torch.ones(2, 37, dtype=torch.long)})
    assert rows(enc, 99) == 2
    # a tokenizer's output before tensors: each value a column of 3 rows of varying length
    lists = BatchEncodingLike({"input_ids": [[101, 7, 102], [101, 102], [101, 9, 9, 102]]})
    assert rows(lists, 99) == 3
    assert rows({"input_ids": [[101, 7, 102], [101, 102]], "labels": [0, 1]}, 99) == 2
    # a detection batch: one tensor per sample, each with its own leading dimension
    assert rows({"boxes": [torch.zeros(3, 4), torch.zeros(5, 4)]}, 99) == 2
    # nested: a mapping whose first countable value is a mapping of tensors
    assert rows({"meta": 1, "inputs": {"pixels": torch.zeros(6, 3, 8, 8)}}, 99) == 6
    # what held before still holds: a tensor's leading dimension, torch's columns
    assert rows(torch.zeros(4, 3), 99) == 4
    assert rows([torch.zeros(5, 3), torch.zeros(5)], 99) == 5


def test_a_door_that_says_lists_are_samples_counts_the_list() -> None:
    rows = _rows()
    images = [np.zeros((16, 16)) for _ in range(8)]       # SPDL's aggregate(8)
    assert rows(images, 99, listed=True) == 8
    assert rows(images, 99) == 16         # torch's columns: the first column's length
    assert rows(torch.zeros(4, 3), 99, listed=True) == 4  # only a list is the samples


def test_the_spdl_door_declares_its_lists_samples_and_the_stream_reads_it() -> None:
    a = helpers.load_agent("_agent_rows_57_spdl")
    assert a.util.door_of("spdl.Pipeline").LISTS_ARE_SAMPLES is True
    assert a.streams.Stream("spdl.Pipeline", "P").listed
    assert not a.streams.Stream("torch.DataLoader", "D").listed
