from __future__ import annotations

import pytest
import torch

from aiayn.nn.masks import (
    causal_mask,
    combine,
    key_padding_to_attention,
    padding_mask,
    sliding_window_mask,
)


def test_causal_is_lower_triangle() -> None:
    assert torch.equal(causal_mask(4), torch.ones(4, 4, dtype=torch.bool).tril())


def test_causal_with_cache_offset_sees_all_past() -> None:
    assert causal_mask(1, 5).tolist() == [[True] * 5]
    with pytest.raises(ValueError, match="at least as many keys"):
        causal_mask(3, 2)


def test_sliding_window_band() -> None:
    m = sliding_window_mask(5, window=3).int().tolist()
    assert m == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    with pytest.raises(ValueError, match="window"):
        sliding_window_mask(3, window=0)


def test_padding_from_lengths_and_ids_agree() -> None:
    ids = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0]])
    by_ids = padding_mask(ids=ids, pad_id=0)
    by_len = padding_mask(lengths=torch.tensor([3, 1]))
    assert by_len.shape == (2, 3)
    assert torch.equal(by_ids[:, :3], by_len)
    assert padding_mask(lengths=torch.tensor([3, 1]), max_len=4).tolist() == by_ids.tolist()
    with pytest.raises(ValueError, match="exactly one"):
        padding_mask()
    with pytest.raises(ValueError, match="pad_id"):
        padding_mask(ids=ids)


def test_combine_ands_and_broadcasts() -> None:
    keep = key_padding_to_attention(torch.tensor([[True, True, False]]))  # (1, 1, 1, 3)
    both = combine(causal_mask(3), None, keep)
    assert both is not None and both.shape == (1, 1, 3, 3)
    assert both[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 0]]
    assert combine(None, None) is None
    with pytest.raises(ValueError, match="boolean"):
        combine(torch.zeros(3, 3))
