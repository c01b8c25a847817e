"""packer.pixels.boxes: boxes scaled, offset and clipped to the picture, and kept or dropped by the one
rule (some of the box left, at least ``min_visibility`` of its area), checked against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from packer.pixels.boxes import place_boxes

WHOLE = (0.0, 0.0, 100.0, 100.0)


def test_a_box_is_scaled_then_offset():
    out = place_boxes([[0, 0, 10, 20], [4, 8, 6, 10]], (2.0, 0.5), (10.0, 5.0), WHOLE, 0.0)
    np.testing.assert_array_equal(out.boxes, [[10, 5, 30, 15], [18, 9, 22, 10]])
    assert out.boxes.dtype == np.float32 and out.kept.tolist() == [0, 1] and out.share.tolist() == [1.0, 1.0]


def test_a_mirroring_scale_swaps_the_edges():
    out = place_boxes([[10, 0, 30, 10]], (-1.0, 1.0), (100.0, 0.0), WHOLE, 0.0)  # a horizontal flip of 100 px
    np.testing.assert_array_equal(out.boxes, [[70, 0, 90, 10]])


def test_a_box_is_clipped_to_the_content_and_its_share_is_what_is_left():
    letterbox = (0.0, 20.0, 100.0, 80.0)  # the picture between bands of fill
    boxes = [[-10, 30, 10, 40], [0, 10, 10, 30], [90, 70, 110, 90]]
    out = place_boxes(boxes, (1.0, 1.0), (0.0, 0.0), letterbox, 0.0)
    np.testing.assert_array_equal(out.boxes, [[0, 30, 10, 40], [0, 20, 10, 30], [90, 70, 100, 80]])
    np.testing.assert_allclose(out.share, [0.5, 0.5, 0.25])


@pytest.mark.parametrize(("min_visibility", "kept"), [(0.0, [0, 1, 2]), (0.25, [0, 1, 2]), (0.3, [0, 1]), (0.6, [1])])
def test_a_box_is_kept_when_at_least_min_visibility_of_it_is_left(min_visibility, kept):
    # shares left inside 0..100: 0.5 (half out on the left), 1.0 (inside), 0.25 (a quarter in the corner)
    boxes = [[-10, 0, 10, 10], [20, 20, 40, 40], [90, 90, 110, 110]]
    out = place_boxes(boxes, (1.0, 1.0), (0.0, 0.0), WHOLE, min_visibility)
    assert out.kept.tolist() == kept and out.kept.dtype == np.int64
    assert len(out.boxes) == len(out.share) == len(kept)


def test_a_box_with_nothing_left_or_no_area_is_dropped_at_any_visibility():
    boxes = [[120, 0, 130, 10], [-30, -30, -10, -10], [100, 0, 110, 10], [5, 5, 5, 50], [7, 7, 7, 7]]
    out = place_boxes(boxes, (1.0, 1.0), (0.0, 0.0), WHOLE, 0.0)
    assert out.boxes.shape == (0, 4) and out.kept.tolist() == [] and out.share.tolist() == []


def test_the_offset_moves_a_box_before_the_clip():
    # a crop 30 px in from the left: the stored box at x 20..40 is at -10..10 in the crop, half left
    out = place_boxes([[20, 0, 40, 10]], (1.0, 1.0), (-30.0, 0.0), WHOLE, 0.5)
    np.testing.assert_array_equal(out.boxes, [[0, 0, 10, 10]])
    assert out.share.tolist() == [0.5]


def test_no_boxes_give_empty_arrays_of_the_right_shape():
    for boxes in ([], np.zeros((0, 4), np.float32)):
        out = place_boxes(boxes, (2.0, 2.0), (1.0, 1.0), WHOLE, 0.0)
        assert out.boxes.shape == (0, 4) and out.boxes.dtype == np.float32 and out.kept.shape == (0,)
