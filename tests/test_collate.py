"""pad_collate: padded ids, masks and lengths, and every other kind of field beside them."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from readers import LengthBucketSampler, pad_collate
from readers.loading.batch_buffers import empty_batch
from readers.loading.collate import Numbered, PackedBatch


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_plain_ids_are_padded_to_the_longest_with_mask_and_lengths():
    out = pad_collate([ids(5, 6, 7), ids(8), ids(9, 10)])
    assert set(out) == {"input_ids", "attention_mask", "lengths"}
    assert out["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert out["lengths"].tolist() == [3, 1, 2]
    assert all(out[k].dtype == torch.int64 for k in out)


def test_ids_label_pairs_give_labels_and_pad_id_is_used():
    out = pad_collate([(ids(1, 2), 3), (torch.tensor([4], dtype=torch.int32), -1)], pad_id=-100)
    assert set(out) == {"input_ids", "attention_mask", "lengths", "labels"}
    assert out["input_ids"].tolist() == [[1, 2], [4, -100]]
    assert out["input_ids"].dtype == torch.int64
    assert out["labels"].tolist() == [3, -1] and out["labels"].dtype == torch.int64


def test_pad_to_multiple_of_rounds_the_width_up():
    out = pad_collate([ids(1, 2, 3, 4, 5), ids(6)], pad_to_multiple_of=4)
    assert out["input_ids"].shape == (2, 8)
    assert out["input_ids"][0].tolist() == [1, 2, 3, 4, 5, 0, 0, 0]
    assert out["attention_mask"].sum(1).tolist() == [5, 1]
    assert pad_collate([ids(1, 2, 3, 4)], pad_to_multiple_of=4)["input_ids"].shape == (1, 4)


def test_max_length_truncates_and_caps_lengths():
    out = pad_collate([ids(1, 2, 3, 4, 5), ids(6, 7)], max_length=3)
    assert out["input_ids"].tolist() == [[1, 2, 3], [6, 7, 0]]
    assert out["lengths"].tolist() == [3, 2]
    assert out["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    both = pad_collate([ids(*range(1, 10)), ids(1)], max_length=8, pad_to_multiple_of=4)
    assert both["input_ids"].shape == (2, 8)
    short = pad_collate([ids(1, 2), ids(3)], max_length=8)  # max_length only cuts, never pads up to itself
    assert short["input_ids"].shape == (2, 2)


def test_an_empty_sequence_is_all_padding():
    out = pad_collate([ids(), ids(1, 2)])
    assert out["input_ids"].tolist() == [[0, 0], [1, 2]]
    assert out["attention_mask"].tolist() == [[0, 0], [1, 1]]
    assert out["lengths"].tolist() == [0, 2]


def test_images_texts_json_labels_and_meta_each_get_their_key():
    samples = [
        (
            torch.full((3, 4, 5), i, dtype=torch.uint8),
            f"caption {i}",
            {"n": i},
            ids(*range(i + 1)),
            i,
            {"index": i, "key": f"k{i}", "label": i},
        )
        for i in range(3)
    ]
    out = pad_collate(samples)
    assert set(out) == {"images", "texts", "json", "input_ids", "attention_mask", "lengths", "labels", "meta"}
    assert out["images"].shape == (3, 3, 4, 5) and out["images"].dtype == torch.uint8
    assert out["images"][:, 0, 0, 0].tolist() == [0, 1, 2]
    assert out["texts"] == ["caption 0", "caption 1", "caption 2"]
    assert out["json"] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert out["input_ids"].tolist() == [[0, 0, 0], [0, 1, 0], [0, 1, 2]]
    assert out["lengths"].tolist() == [1, 2, 3]
    assert out["labels"].tolist() == [0, 1, 2]
    assert [m["key"] for m in out["meta"]] == ["k0", "k1", "k2"]


def test_text_with_label_and_json_before_the_label_is_a_field():
    out = pad_collate([("a", {"x": 1}, 0), ("b", {"x": 2}, 1)])
    assert set(out) == {"texts", "json", "labels"}
    assert out["texts"] == ["a", "b"] and out["json"] == [{"x": 1}, {"x": 2}] and out["labels"].tolist() == [0, 1]


def test_float_images_and_numpy_ids_are_accepted():
    out = pad_collate([(torch.zeros(3, 2, 2), np.array([1, 2]), 0), (torch.ones(3, 2, 2), np.array([3]), 1)])
    assert out["images"].dtype == torch.float32 and out["images"].shape == (2, 3, 2, 2)
    assert out["input_ids"].tolist() == [[1, 2], [3, 0]]


def test_images_of_different_shapes_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="--size"):
        pad_collate([(torch.zeros(3, 4, 4), 0), (torch.zeros(3, 4, 5), 1)])


@pytest.mark.parametrize(
    "samples,match",
    [
        ([(ids(1), 0), ("text", 1)], "sample 1 is \\(text, label\\) but sample 0 is \\(token ids, label\\)"),
        ([(ids(1), 0), (ids(1), 0, {"index": 0})], "same fields"),
        ([ids(1), (ids(2), 0)], "same fields"),
    ],
)
def test_mixed_structures_are_refused(samples, match):
    with pytest.raises(ValueError, match=match):
        pad_collate(samples)


def test_samples_it_cannot_batch_are_refused_clearly():
    with pytest.raises(ValueError, match="two token ids fields"):
        pad_collate([(ids(1), ids(2), 0)])
    with pytest.raises(ValueError, match="last int"):
        pad_collate([(ids(1), 3, 4)])
    with pytest.raises(TypeError, match="cannot batch a float"):
        pad_collate([(ids(1), 0.5)])
    with pytest.raises(ValueError, match="empty batch"):
        pad_collate([])
    with pytest.raises(ValueError, match="multiple"):
        pad_collate([ids(1)], max_length=6, pad_to_multiple_of=4)


def test_reader_batches_pass_through():
    images, labels = torch.zeros(2, 3, 4, 4), torch.tensor([1, 2])
    assert pad_collate(PackedBatch(images, labels)) == {"images": images, "labels": labels}
    numbered = pad_collate(Numbered(7, [ids(1, 2), ids(3)]))
    assert numbered.number == 7 and numbered.batch["input_ids"].tolist() == [[1, 2], [3, 0]]


def test_dataloader_with_the_bucket_sampler_and_pad_collate():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 40, size=103)
    data = [(torch.arange(1, n + 1), i % 5) for i, n in enumerate(lengths)]
    sampler = LengthBucketSampler(lengths, 8, seed=1, bucket_batches=4)
    loader = DataLoader(data, batch_sampler=sampler, collate_fn=partial(pad_collate, pad_id=-1), num_workers=0)
    seen = 0
    for batch, indices in zip(loader, sampler.batches(0)):
        assert batch["lengths"].tolist() == lengths[indices].tolist()
        assert batch["input_ids"].shape == (len(indices), lengths[indices].max())
        assert ((batch["input_ids"] == -1) == (batch["attention_mask"] == 0)).all()
        seen += len(indices)
    assert seen == len(data)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32])
@pytest.mark.parametrize("channels_last", [False, True])
def test_empty_batch_in_the_main_process(dtype, channels_last):
    out = empty_batch((64, 3, 224, 224), dtype, channels_last)
    assert out.shape == (64, 3, 224, 224) and out.dtype == dtype and not out.is_shared()
    physical = out.permute(0, 2, 3, 1) if channels_last else out
    assert physical.is_contiguous()  # NHWC bytes for channels_last: one plain copy per stored image
    out[5, 2, 100, 7] = 9
    assert (
        physical.flatten()[np.ravel_multi_index((5, 100, 7, 2) if channels_last else (5, 2, 100, 7), physical.shape)]
        == 9
    )
