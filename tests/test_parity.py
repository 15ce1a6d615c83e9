"""The parity harness (lib/parity): its own logic without the reference; the comparisons themselves against a
checkout of the reference given by SNIPER_REFERENCE_DIR (skipped when unset)."""
import os

import numpy as np
import pytest

from chip_generator.cover import candidate_windows, generate
from lib.parity.compare import _unshuffled_project_cover, compare_chips, format_table, replay_order, run
from lib.parity.reference import ReferenceCheckout
from lib.parity.shim import load_python2_module, py2_round, stub_module

PYTHON2 = '''
import cPickle
from .helpers import twice

def evens(limit):
    print "evens up to", limit
    return [twice(i) for i in xrange(limit)]

def rounded(value):
    return round(value, 1)

def first_key(mapping):
    return sorted(mapping.iterkeys())[0]
'''


def test_python2_source_is_converted_and_its_imports_answered_by_stubs():
    helpers = stub_module("pkg.helpers", twice=lambda i: 2 * i)
    stubs = {"pkg": stub_module("pkg", __path__=[]), "pkg.helpers": helpers}
    module = load_python2_module(PYTHON2, "pkg.sample", stubs, package="pkg")
    assert module.evens(3) == [0, 2, 4] and module.first_key({"b": 1, "a": 2}) == "a"
    # Python 2's round: ties away from zero, also for NumPy scalars (Python 3: 0.2, NumPy: 0.2)
    assert module.rounded(0.25) == 0.3 and module.rounded(np.float64(-0.25)) == -0.3
    assert round(0.25, 1) == 0.2
    import sys
    assert "pkg.helpers" not in sys.modules  # the stubs answer the imports only while the module loads


def test_py2_round_is_correctly_rounded_on_the_binary_value():
    # 2.675 is 2.67499999999999982236431605997495353221893310546875 in binary: down, as Python 2 rounds it
    assert py2_round(2.675, 2) == 2.67 and py2_round(1.5) == 2.0 and py2_round(2.5) == 3.0
    assert py2_round(np.float32(0.001953125), 8) == 0.00195313


def test_replay_order_maps_the_reference_shuffle_onto_the_project_windows():
    windows = np.array([[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5]])
    shuffled = np.array([[4, 4, 5, 5], [0, 0, 1, 1], [4, 4, 5, 5], [2, 2, 3, 3]], np.float32)  # a duplicate
    np.testing.assert_array_equal(replay_order(windows, shuffled), [2, 0, 1])
    assert replay_order(windows, shuffled[:2]) is None  # a project window the reference lacks
    assert replay_order(windows[:2], shuffled) is None  # a reference window the project lacks


def test_generate_replays_a_given_order_as_its_shuffle():
    boxes = np.array([[10, 10, 60, 60], [300, 200, 420, 330], [700, 40, 760, 90]], np.float32)
    count = len(candidate_windows(900, 600, 512, 32, "reference"))
    order = np.random.default_rng(3).permutation(count)
    np.testing.assert_array_equal(generate(boxes, 900, 600, 512, 32, order=order),
                                  generate(boxes, 900, 600, 512, 32, rng=3))
    with pytest.raises(ValueError, match=f"permutation of the {count} candidate windows"):
        generate(boxes, 900, 600, 512, 32, order=np.zeros(count, np.int64))


class ProjectAsReference:
    """A stand-in for the compiled reference: the project's cover with a known shuffle, the shuffled
    candidates reported with a duplicate as the reference's list may hold; ``wrong`` drops the last chip."""

    def __init__(self, wrong=False):
        self.wrong = wrong

    def generate(self, boxes, width, height, chip_size, stride, seed):
        windows = candidate_windows(width, height, chip_size, stride, "reference")
        order = np.random.default_rng(seed + 100).permutation(len(windows))
        chips = generate(boxes, width, height, chip_size, stride, order=order)
        shuffled = np.concatenate([windows[order], windows[order[:1]]]).astype(np.float32)
        return (chips[:-1] if self.wrong and len(chips) else chips), shuffled


def clip_to_w_minus_2(boxes, shape):  # the reference's clip_boxes given (H - 1, W - 1), as its generator calls it
    boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, shape[1] - 1)
    boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, shape[0] - 1)
    return boxes


def test_chip_comparison_counts_agreement_per_case():
    rows = dict(compare_chips(ProjectAsReference(), clip_to_w_minus_2, 12, seed=1))
    assert rows["candidate windows identical (as sets)"] == "100.0% (12 / 12)"
    assert rows["chips identical, in pick order (the reference's shuffle replayed)"] == "100.0% (12 / 12)"
    wrong = dict(compare_chips(ProjectAsReference(wrong=True), clip_to_w_minus_2, 12, seed=1))
    assert wrong["chips identical, in pick order (the reference's shuffle replayed)"] == "0.0% (0 / 12)"


def test_the_miner_s_covers_take_the_candidates_unshuffled_only_inside_the_context():
    import chip_generator.mining as mining

    boxes = np.array([[10, 10, 60, 60], [300, 200, 420, 330]], np.float32)
    count = len(candidate_windows(900, 600, 512, 32, "reference"))
    with _unshuffled_project_cover():
        unshuffled = mining.generate(boxes, 900, 600, 512, 32, rng=5)
    np.testing.assert_array_equal(unshuffled, generate(boxes, 900, 600, 512, 32, order=np.arange(count)))
    assert mining.generate is generate


def test_merge_matching_uses_each_project_detection_once_within_the_tolerances():
    from lib.parity.compare import _matched

    mine = np.array([[0, 0, 10, 10, 0.5, 1], [0, 0, 10, 10.005, 0.50005, 1], [5, 5, 9, 9, 0.3, 2]], np.float32)
    theirs = [(1, np.array([0, 0, 10, 10]), 0.5), (1, np.array([0, 0, 10, 10]), 0.5),  # two: both found once
              (1, np.array([0, 0, 10, 10]), 0.5), (2, np.array([5, 5, 9, 9.02]), 0.3), (1, np.array([5, 5, 9, 9]), 0.3)]
    assert _matched(theirs, mine) == 2  # the third copy, the 0.02 px box and the wrong label are not


def test_tables_are_markdown_under_a_title():
    text = format_table("T", ["quantity", "agreement"], [["a", "1"]])
    assert text.splitlines()[0] == "### T" and text.splitlines()[2].startswith("| quantity")


def test_a_folder_that_is_not_the_reference_is_refused_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"--reference {tmp_path}: not a checkout of the SNIPER reference"):
        ReferenceCheckout(str(tmp_path))


REFERENCE = os.environ.get("SNIPER_REFERENCE_DIR")


@pytest.mark.skipif(not REFERENCE, reason="SNIPER_REFERENCE_DIR (a checkout of the reference) is not set")
def test_against_the_reference_chips_mining_merge_coco_boxes_and_results_agree():
    tables = run(ReferenceCheckout(REFERENCE), cases=20, images=10, seed=3)
    lines = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
             for line in tables.splitlines() if line.startswith("| ")}
    assert lines["chips identical, in pick order (the reference's shuffle replayed)"] == ["100.0% (20 / 20)"]
    # the miner with the reference rules (first column) on 10 scenes x 3 scales
    assert lines["positive chips identical, in pick order (image, scale)"][0] == "100.0% (30 / 30)"
    assert lines["(image, scale) with every chip's valid gts identical (of those)"][0] == "100.0% (30 / 30)"
    assert lines["negative chips identical, with their counts and counted gts (image, scale)"][0] == "100.0% (30 / 30)"
    assert lines["reference final detections the project gives (label, box within 0.01 px, score within 1e-4)"][0] \
        .startswith("100.0% (")
    assert lines["images with as many final detections"] == ["100.0% (10 / 10)"]
    # the remaining COCO difference: boxes starting left of / above the image (docs/reference_differences.md)
    assert lines["gt boxes arrays identical (images)"][1] == "100.0% (10 / 10)"
    assert lines["results entries identical (box with 1 decimal, score with 8)"][0].startswith("100.0%")
