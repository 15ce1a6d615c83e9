"""The parity harness (dev/parity): its own logic without the reference; the comparisons themselves against a
checkout of the reference given by SNIPER_REFERENCE_DIR (skipped when unset)."""
import os
import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from chip_generator.cover import candidate_windows, generate
from lib.bootstrap import ROOT
from lib.config import load_config
from dev.parity.compare import unshuffled_project_cover, compare_chips, replay_order
from dev.parity.harness import run
from dev.parity.reference import ReferenceCheckout
from dev.parity.shim import load_python2_module, py2_round, stub_module
from dev.parity.tables import format_table

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
    with unshuffled_project_cover():
        unshuffled = mining.generate(boxes, 900, 600, 512, 32, rng=5)
    np.testing.assert_array_equal(unshuffled, generate(boxes, 900, 600, 512, 32, order=np.arange(count)))
    assert mining.generate is generate


def test_merge_matching_uses_each_project_detection_once_within_the_tolerances():
    from lib.benchmarking import matched_detections

    mine = np.array([[0, 0, 10, 10, 0.5, 1], [0, 0, 10, 10.005, 0.50005, 1], [5, 5, 9, 9, 0.3, 2]], np.float32)
    theirs = [(1, np.array([0, 0, 10, 10]), 0.5), (1, np.array([0, 0, 10, 10]), 0.5),  # two: both found once
              (1, np.array([0, 0, 10, 10]), 0.5), (2, np.array([5, 5, 9, 9.02]), 0.3), (1, np.array([5, 5, 9, 9]), 0.3)]
    assert matched_detections(theirs, mine) == 2  # the third copy, the 0.02 px box and the wrong label are not


def test_tables_are_markdown_under_a_title():
    text = format_table("T", ["quantity", "agreement"], [["a", "1"]])
    assert text.splitlines()[0] == "### T" and text.splitlines()[2].startswith("| quantity")


def test_a_folder_that_is_not_the_reference_is_refused_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"--reference {tmp_path}: not a checkout of the SNIPER reference"):
        ReferenceCheckout(str(tmp_path))


REFERENCE = os.environ.get("SNIPER_REFERENCE_DIR")
FORK = os.environ.get("SNIPER_FORK_DIR")


@pytest.mark.skipif(not REFERENCE, reason="SNIPER_REFERENCE_DIR (a checkout of the reference) is not set")
def test_against_the_reference_chips_mining_targets_merge_coco_boxes_results_and_mask_graphs_agree():
    tables = run(ReferenceCheckout(REFERENCE), cases=20, images=10, seed=3, scenes=3, test_images=6, mask_chips=1,
                 mask_chip_size=128)
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
    # the chips' network inputs and RPN targets (reference rules: first column)
    for name in ("chips paired (the same chip, scale and position on both sides)",
                 "anchor labels before sampling identical (anchors)", "`gt_boxes` arrays identical (chips)",
                 "`valid_ranges` identical (chips)", "`im_info` identical (chips)"):
        assert lines[name][0].startswith("100.0% ("), name
    assert lines["RPN box targets within 1e-4 (anchors positive on both sides) / largest difference"][0] \
        .startswith("100.0% (")
    assert lines["chip pixels identical (chips) / mean absolute difference"][0].endswith(" / 0.000")
    # the test batches of both reference iterators: every batch, factor, extent and canvas pixel
    for name in ("batches identical: images, order and canvas (3 scales)", "resize factors identical (image results)",
                 "`im_info` extents identical (image results)"):
        assert all(cell.startswith("100.0% (") for cell in lines[name]), name
    assert all(cell.startswith("100.0% (") and cell.endswith(" / 0.000")
               for cell in lines["canvas pixels identical (image results) / mean absolute difference"])
    # the remaining COCO difference: boxes starting left of / above the image (docs/reference_differences.md)
    assert lines["gt boxes arrays identical (images)"][1] == "100.0% (10 / 10)"
    assert lines["results entries identical (box with 1 decimal, score with 8)"][0].startswith("100.0%")
    # the mask training graphs: the reference's own symbol file against training_symbol with TRAIN.WITH_MASK
    for name, count in (("parameter names identical (of both sides' names)", 343),
                        ("parameter shapes identical (shared names)", 343), ("auxiliary state names identical", 202),
                        ("auxiliary state shapes identical (shared names)", 202)):
        assert lines[name] == [f"100.0% ({count} / {count})"] * 2 + ["-"], name
    from dev.parity.mask_network import SIGNATURE_ROWS

    assert lines[SIGNATURE_ROWS[4]] == ["100.0% (351 / 351)", "97.7% (343 / 351)",
                                        "fp16 off: mask_conv_3x3 (8) (docs: fp16 casts of the mask branch)"]
    assert lines[SIGNATURE_ROWS[5]][:2] == ["7 / 7; identical"] * 2
    outputs = [cells for name, cells in lines.items() if name.endswith("_output`")]
    assert len(outputs) == 7
    # stock deformable operators as the reference: the same numbers (bit-identical when measured); compiled: last bits
    assert all(_relative(cells[1]) <= 1e-6 and _relative(cells[2]) <= 1e-4 for cells in outputs)
    count, stock = lines["every parameter"][:2]
    assert count == "343" and stock.split(";")[0].endswith(" / 343") and _relative(stock) <= 1e-5
    assert _relative(lines["auxiliary states after the forward"][1]) <= 1e-6


def _relative(cell):
    """The relative difference of a mask table cell ``... abs / rel``."""
    return float(cell.rsplit("/", 1)[1])


# ---- the test side: the fork's proposal operator on shared canvases -------------------------------------

def test_a_result_is_compared_on_the_kept_boxes_the_fork_pads_with_random_ones():
    from dev.parity.detection import compare_result

    kept = np.array([[0, 1, 2, 30, 40], [0, 5, 5, 9, 9]], np.float32)
    project_rois, project_scores = kept[[0, 1, 0, 1]], np.array([0.9, 0.5, 0.9, 0.5], np.float32)
    fork_rois = np.vstack([kept, [[0, 17, 3, 250, 380], [0, 2, 99, 311, 201]]]).astype(np.float32)
    fork_scores = np.array([0.9, 0.5, 0, 0], np.float32)
    assert compare_result(fork_rois, fork_scores, project_rois, project_scores) == (True, True, 0.0)
    shifted = fork_rois.copy()
    shifted[1, 3] = np.nextafter(np.float32(9), np.float32(10))  # one ulp
    same, padded, difference = compare_result(shifted, fork_scores, project_rois, project_scores)
    assert not same and padded and difference == pytest.approx(9.5367e-7, rel=1e-3)
    fork_scores[2] = 0.1  # a third box the project does not keep
    assert not compare_result(fork_rois, fork_scores, project_rois, project_scores)[0]


def test_random_batches_share_a_canvas_filled_by_their_first_image_and_flat_beyond_each_image():
    from dev.parity.detection import STRIDE, random_canvas_batch

    rng = np.random.default_rng(4)
    for _ in range(5):
        cls_prob, bbox_pred, im_info = random_canvas_batch(rng)
        batch, _, height, width = cls_prob.shape
        assert batch in (2, 4) and len(im_info) == batch and bbox_pred.shape == (batch, 2 * cls_prob.shape[1]) + (
            height, width)
        assert -(-im_info[0, 0] // STRIDE) == height and -(-im_info[0, 1] // STRIDE) == width
        assert np.all(im_info[:, :2] <= im_info[0, :2]) and np.all(im_info[:, 2] == 1)
        np.testing.assert_allclose(cls_prob[:, :21] + cls_prob[:, 21:], 1, atol=1e-6)
        for b, (h, w, _) in enumerate(im_info):
            rows, cols = int(-(-h // STRIDE)), int(-(-w // STRIDE))
            if rows < height:  # the padding below the image: one value per channel
                assert np.ptp(cls_prob[b, :, rows:], axis=(1, 2)).max() == 0
                assert np.ptp(bbox_pred[b, :, rows:, cols:], axis=(1, 2)).max() == 0 if cols < width else True


class ProjectAsFork:
    """A stand-in for the compiled fork operator: the project's layer, its padding written as the fork's
    (random boxes of score 0); ``clip_to_canvas`` clips every image's boxes to the canvas instead."""

    def __init__(self, clip_to_canvas=False):
        self.clip_to_canvas = clip_to_canvas

    def __call__(self, cls_prob, bbox_pred, im_info, stride, scales, ratios, post_nms_top_n, seed=0):
        from lib.boxes.proposals import proposals

        info = im_info.copy()
        if self.clip_to_canvas:
            info[:, :2] = im_info[0, :2]  # the canvas: the extent of the batch's first (largest) image
        rois, scores = proposals(cls_prob, bbox_pred, info, stride, scales, ratios, 12000, post_nms_top_n, 0.7, 3)
        rng = np.random.default_rng(seed)
        for b in range(len(im_info)):
            rows = slice(b * post_nms_top_n, (b + 1) * post_nms_top_n)
            kept = len(np.unique(rois[rows], axis=0))
            rois[rows][kept:, 1:] = rng.integers(0, 400, (post_nms_top_n - kept, 4))
            scores[rows][kept:] = 0
        return rois, scores[:, 0]


def test_the_proposal_comparison_finds_a_layer_that_clips_to_the_canvas_on_the_smaller_images():
    from dev.parity.detection import compare_test_proposals

    rows = dict((row[0], row[1]) for row in compare_test_proposals(ProjectAsFork(), 3, seed=2))
    compared = [value for name, value in rows.items() if name.startswith(("results identical", "the same"))]
    assert len(compared) == 2 and all(value.startswith("100.0%") for value in compared)
    assert rows["largest coordinate difference of a kept box (px)"] == "0"
    rows = dict((row[0], row[1]) for row in compare_test_proposals(ProjectAsFork(clip_to_canvas=True), 3, seed=2))
    assert rows["results identical, kept boxes and scores bit for bit: first image of a batch (fills the canvas)"] \
        .startswith("100.0%")
    assert rows["the same: the batch's other images (smaller than the canvas)"].startswith("0.0%")


FAKE_FORK_OPERATOR = r'''
#include "./multi_proposal-inl.h"
#include <dmlc/logging.h>
#include <mshadow/tensor.h>
#include "./operator_common.h"
namespace mxnet {
namespace op {
template<typename xpu>
class MultiProposalGPUOp : public Operator {
 public:
  explicit MultiProposalGPUOp(MultiProposalParam param) : param_(param) {}
  virtual void Forward(const OpContext &ctx, const std::vector<TBlob> &in_data, const std::vector<OpReqType> &req,
                       const std::vector<TBlob> &out_data, const std::vector<TBlob> &aux_states) {
    using namespace mshadow;
    CHECK_EQ(in_data.size(), 3);
    Stream<xpu> *s = ctx.get_stream<xpu>();
    Tensor<cpu, 2> info = in_data[proposal::kImInfo].get<cpu, 2, real_t>(s);
    Tensor<cpu, 2> rois = out_data[proposal::kRoIs].get<cpu, 2, real_t>(s);
    Tensor<cpu, 1> scores = out_data[proposal::kScores].get<cpu, 1, real_t>(s);
    for (int r = 0; r < rois.size(0); r++) {  // each image's height, width, stride and first ratio x scale
      int b = r / param_.rpn_post_nms_top_n;
      float row[5] = {(float)b, info.dptr_[3 * b], info.dptr_[3 * b + 1], (float)param_.feature_stride,
                      param_.ratios[0] * param_.scales[param_.scales.ndim() - 1]};
      std::memcpy(rois.dptr_ + 5 * r, row, sizeof(row));
      scores.dptr_[r] = (float)(rand() % 2);
    }
  }
 private:
  MultiProposalParam param_;
};
template<>
Operator *CreateOp<cpu>(MultiProposalParam param) { return new MultiProposalGPUOp<cpu>(param); }
Operator* MultiProposalProp::CreateOperator(Context ctx) const { DO_BIND_DISPATCH(CreateOp, param_); }
DMLC_REGISTER_PARAMETER(MultiProposalParam);
MXNET_REGISTER_OP_PROPERTY(MultiProposal, MultiProposalProp)
.describe("Proposal Generator")
.add_argument("cls_prob", "NDArray-or-Symbol", "Proposal Score")
.add_arguments(MultiProposalParam::__FIELDS__());
}  // namespace op
}  // namespace mxnet
'''


def test_the_fork_s_operator_source_compiles_against_the_stand_ins_and_is_called_with_its_inputs(tmp_path):
    from dev.parity.fork import PROPOSAL_SOURCE, ForkCheckout

    with pytest.raises(FileNotFoundError, match=f"--fork {tmp_path}: not a checkout of the reference's MXNet fork"):
        ForkCheckout(str(tmp_path))
    source = tmp_path / PROPOSAL_SOURCE
    source.parent.mkdir(parents=True)
    source.write_text(FAKE_FORK_OPERATOR)
    operator = ForkCheckout(str(tmp_path)).multi_proposal(str(tmp_path / "build"))
    im_info = np.array([[48, 80, 1], [32, 64, 1]], np.float32)
    rois, scores = operator(np.zeros((2, 6, 3, 5)), np.zeros((2, 12, 3, 5)), im_info, 16, (2, 8), (0.5, 1, 2), 4,
                            seed=3)
    np.testing.assert_array_equal(rois, [[0, 48, 80, 16, 4]] * 4 + [[1, 32, 64, 16, 4]] * 4)
    again = operator(np.zeros((2, 6, 3, 5)), np.zeros((2, 12, 3, 5)), im_info, 16, (2, 8), (0.5, 1, 2), 4, seed=3)
    np.testing.assert_array_equal(scores, again[1])  # srand(seed) fixes its rand()
    with pytest.raises(ValueError, match="21 x 200 x 200 anchors per image"):
        operator(np.zeros((1, 42, 201, 201)), np.zeros((1, 84, 201, 201)), im_info[:1], 16, (2,), (1,), 4)


@pytest.mark.skipif(not FORK, reason="SNIPER_FORK_DIR (a checkout of the reference's MXNet fork) is not set")
def test_against_the_fork_the_test_proposal_layer_is_bit_identical_on_shared_canvases(tmp_path):
    from dev.parity.detection import compare_test_proposals
    from dev.parity.fork import ForkCheckout

    rows = dict(compare_test_proposals(ForkCheckout(FORK).multi_proposal(str(tmp_path)), 6, seed=1))
    assert rows["results identical, kept boxes and scores bit for bit: first image of a batch (fills the canvas)"] \
        == "100.0% (6 / 6)"
    assert rows["the same: the batch's other images (smaller than the canvas)"].startswith("100.0%")


# ---- the training side: chip inputs and RPN targets --------------------------------------------------------

def test_target_tally_counts_anchors_positives_arrays_and_pixels():
    from dev.parity.chip_targets import TargetTally

    labels = np.array([1, 0, -1, 0], np.float32)
    pixels = np.zeros((3, 2, 2), np.float32)
    theirs = (labels, {(0, 0, 0): 0.5, (1, 0, 0): 0.25}, np.zeros((100, 5)), np.array([0., 512.]),
              np.array([512., 512., 2.]), pixels)
    mine = (labels.copy(), {(0, 0, 0): 0.5, (1, 0, 0): 0.2502, (2, 0, 0): 1.0}, np.zeros((100, 5), np.float32),
            np.array([0, 512], np.float32), np.array([512, 512, 2], np.float32), pixels + 0.5)
    mine[0][1] = -1
    tally = TargetTally()
    tally.counts["chips"] = 2  # one reference chip without a project counterpart
    tally.add(theirs, mine)
    rows = dict(tally.rows())
    assert rows["chips paired (the same chip, scale and position on both sides)"] == "50.0% (1 / 2)"
    assert rows["anchor labels before sampling identical (anchors)"] == "75.0% (3 / 4)"
    # anchors positive on both sides: two; one target 2e-4 off
    assert rows["RPN box targets within 1e-4 (anchors positive on both sides) / largest difference"] == \
        "50.0% (1 / 2) / 0.0002"
    assert rows["`gt_boxes` arrays identical (chips)"] == rows["`im_info` identical (chips)"] == "100.0% (1 / 1)"
    assert rows["chip pixels identical (chips) / mean absolute difference"] == "0.0% (0 / 1) / 0.500"


class RecordingWorkers:
    """A stand-in for the reference's data_workers: records what its anchor and image workers are given."""

    def __init__(self):
        self.calls = {}

    def anchor_worker(self, cfg, chip_size):
        calls = self.calls

        class Anchors:
            feat_width = feat_height = 32.0  # what Python 3 makes of the reference's 512 / 16

            def worker(self, arguments):
                calls["anchors"] = arguments
                return [np.zeros((1, 4), np.float16), np.array([0.5]), np.array([[2], [3], [4]]), -np.ones((100, 5))]

        return Anchors()

    def im_worker(self, crop_size, cfg):
        calls = self.calls

        class Images:
            def worker(self, arguments):
                calls["image"] = arguments
                return np.ones((3, crop_size, crop_size))

        return Images()


def test_the_reference_chip_gets_the_arguments_its_iterator_builds():
    from dev.parity.chip_targets import reference_anchor_worker, reference_chip_inputs, reference_config

    cfg = load_config(None, [("TRAIN.SCALES", "[3.0, 1.667, 512.0]"),
                             ("TRAIN.VALID_RANGES", "[[-1, 80], [32, 150], [120, -1]]")])
    ref_cfg = reference_config(cfg)
    assert ref_cfg.TRAIN.RPN_POSITIVE_OVERLAP == cfg.TRAIN.RPN_POSITIVE_OVERLAP
    assert ref_cfg.TRAIN.RPN_BATCH_SIZE > 10 ** 6
    workers = RecordingWorkers()
    anchors = reference_anchor_worker(workers, ref_cfg)
    assert anchors.feat_width == anchors.feat_height == 32 and isinstance(anchors.feat_width, int)
    boxes = np.array([[0, 0, 50, 60], [10, 10, 90, 80], [5, 5, 30, 30]], np.float32)  # two gts, a proposal
    entry = {"boxes": boxes, "max_overlaps": np.array([1, 1, 0]), "max_classes": np.array([3, 1, 0]),
             "image": "x.png", "flipped": True}
    crop = (np.array([10.0, 20.0, 180.0, 190.0]), 1.667, 512, 512, 1)
    labels, targets, gt_boxes, valid_ranges, im_info, pixels = reference_chip_inputs(
        workers, anchors, ref_cfg, entry, crop, [1, 2])
    im_info_arg, chip, scale, members, gtids, gts, all_boxes, classes = workers.calls["anchors"]
    assert im_info_arg == [512, 512, 1.667] and chip is crop[0] and scale == 1.667
    assert members.dtype == np.int32 and members.tolist() == [1, 2] and gtids.tolist() == [0, 1]
    np.testing.assert_array_equal(gts, boxes[:2])
    np.testing.assert_array_equal(all_boxes, boxes)
    assert classes.tolist() == [[3], [1]] and workers.calls["image"] == ["x.png", crop, True]
    np.testing.assert_allclose(valid_ranges, [32 * 1.667, 150 * 1.667])
    np.testing.assert_array_equal(im_info, [512, 512, 1.667])
    assert targets == {(2, 3, 4): 0.5} and labels.shape == (4,) and pixels.shape == (3, 512, 512)
    coarsest = (np.array([0.0, 0.0, 300.0, 200.0]), 0.8, 160, 240, 2)
    valid_ranges, im_info = reference_chip_inputs(workers, anchors, ref_cfg, entry, coarsest, [0])[3:5]
    np.testing.assert_allclose(valid_ranges, [120 * 0.8, 512])  # the open end: the input size
    np.testing.assert_array_equal(im_info, [160, 240, 0.8])


def test_the_project_chip_is_written_by_the_loader_s_worker_into_one_slot(tmp_path):
    import cv2

    from lib.data.anchor_target import AnchorTargeter, AnchorTargetParams
    from lib.data.chip_worker import ChipWorker, batch_fields
    from lib.data.epoch_plan import ChipRef
    from dev.parity.chip_targets import OneSlotRing, project_chip_inputs, project_config

    cfg = project_config((3.0, 1.667, 512.0), ((-1, 80), (32, 150), (120, -1)), 56)
    image = np.full((100, 120, 3), 100, np.uint8)
    cv2.imwrite(str(tmp_path / "a.png"), image)
    entry = {"image": str(tmp_path / "a.png"), "width": 120, "height": 100, "flipped": False,
             "boxes": np.array([[10, 10, 59, 49]], np.float32), "gt_classes": np.array([2], np.int32)}
    targeter = AnchorTargeter(AnchorTargetParams.from_config(cfg))
    worker = ChipWorker([entry], cfg, OneSlotRing(batch_fields(cfg, targeter, rpn_only=False)), rpn_only=False)
    labels, targets, gt_boxes, valid_ranges, im_info, pixels = project_chip_inputs(
        worker, ChipRef(0, 2, 4.0, (0.0, 0.0, 479.0, 399.0), (0,)))
    # the box at scale 4: [40, 40, 236, 196], class 2, the only gt row; sampling off: every negative kept
    np.testing.assert_array_equal(gt_boxes[0], [40, 40, 236, 196, 2])
    assert np.all(gt_boxes[1:] == -1) and (labels == 1).any() and (labels == 0).sum() > 1000
    assert len(targets) == 4 * (labels == 1).sum() and all(len(key) == 3 for key in targets)
    np.testing.assert_array_equal(im_info, [400, 480, 4.0])  # the coarsest scale: the scaled image
    np.testing.assert_allclose(pixels[:, 0, 0], 100 - np.array(cfg.network.PIXEL_MEANS)[::-1], atol=1e-4)


# ---- the test side: batches and canvases ----------------------------------------------------------------

class FakeTestIterator:
    """A stand-in for a reference test iterator: one image a batch, each part's images in reverse order."""

    parts = []

    def __init__(self, roidb, config, test_scale, batch_size, threads, nGPUs, pad_rois_to, crop_size, num_classes):
        FakeTestIterator.parts.append([entry["width"] for entry in roidb])
        self.order, self.batch = list(range(len(roidb)))[::-1], None

    def iter_next(self):
        if not self.order:
            return False
        index = self.order.pop(0)
        self.batch = SimpleNamespace(data=[np.zeros((1, 3, 4, 4)), np.array([[4, 4, 1.0]]), np.array([index])])
        return True


def test_reference_batches_follow_its_wrapper_s_split_into_contiguous_parts():
    from dev.parity.detection import reference_batches

    roidb = [{"width": w} for w in (10, 11, 12, 13, 14)]
    FakeTestIterator.parts = []
    batches = reference_batches(FakeTestIterator, roidb, None, (800, 1280), 1, parts=2)
    assert FakeTestIterator.parts == [[10, 11, 12], [13, 14]]  # ceil(5 / 2) = 3 images a part
    assert [members for members, _, _ in batches] == [[2], [1], [0], [4], [3]]  # indices into the whole set


def test_scale_batches_are_compared_on_the_images_each_batch_gives_and_their_canvas(tmp_path):
    import cv2

    from lib.inference.batching import plan_level
    from lib.inference.streaming import prepare_image
    from dev.parity.detection import compare_scale_batches
    from lib.scales import pyramid

    cfg = load_config(None, [("TEST.SCALES", "[[100, 160]]"), ("TEST.VALID_RANGES", "[[-1, -1]]"),
                             ("TEST.BATCH_IMAGES", "2")])
    rng = np.random.default_rng(0)
    roidb = []
    for index, (height, width) in enumerate(((50, 80), (40, 60), (60, 90))):
        cv2.imwrite(str(tmp_path / f"{index}.png"), rng.integers(0, 255, (height, width, 3)).astype(np.uint8))
        roidb.append({"image": str(tmp_path / f"{index}.png"), "height": height, "width": width})
    spec = pyramid(cfg.TEST, "TEST")[0].spec
    plan = plan_level([(e["height"], e["width"]) for e in roidb], spec, 2, 1)
    # the reference's batches of the same plan: by area, the last padded by repeating its last image
    assert [b.images for b in plan] == [(1, 0), (2,)]

    def batch(members, canvas):
        data = np.zeros((len(members), 3) + canvas, np.float32)
        info = np.zeros((len(members), 3), np.float32)
        for slot, index in enumerate(members):
            scale = spec.image_scale(roidb[index]["height"], roidb[index]["width"])
            image = cv2.imread(roidb[index]["image"])
            info[slot] = (*prepare_image(image, scale, cfg.network.PIXEL_MEANS, "RGB", data[slot]), scale)
        return members, data, info

    theirs = [batch([1, 0], plan[0].canvas), batch([2, 2], plan[1].canvas)]
    counts, difference = compare_scale_batches(theirs, plan, roidb, cfg.network.PIXEL_MEANS)
    assert counts.tolist() == [2, 2, 3, 3, 3, 3] and difference == 0
    theirs[0][1][1, 0, 0, 0] += 2  # one pixel of image 0
    theirs[1] = batch([2, 2], (plan[1].canvas[0] + 16, plan[1].canvas[1]))  # a larger canvas
    counts, difference = compare_scale_batches(theirs, plan, roidb, cfg.network.PIXEL_MEANS)
    assert counts.tolist() == [2, 1, 3, 3, 3, 1] and difference == pytest.approx(2 / (3 * 100 * 160))


# ---- the proposal target: the fork's GPU operator's outputs against the project's ---------------------------

def test_random_target_chips_are_what_the_loader_hands_the_operator():
    from dev.parity.proposal_target import random_target_inputs

    inputs = random_target_inputs(np.random.default_rng(2), 12)
    cls_prob, gt_boxes, im_info, valid_ranges = (inputs[k] for k in ("cls_prob", "gt_boxes", "im_info",
                                                                     "valid_ranges"))
    assert cls_prob.shape == (12, 42, 32, 32) and inputs["bbox_pred"].shape == (12, 84, 32, 32)
    np.testing.assert_allclose(cls_prob[:, :21] + cls_prob[:, 21:], 1, atol=1e-6)
    for c in range(12):
        real = gt_boxes[c, :, 4] != -1
        count = int(real.sum())
        assert count >= 1 and real[:count].all()  # the -1 rows last, as the fork reads them
        boxes = gt_boxes[c, :count, :4]
        assert np.all(boxes == np.floor(boxes)) and np.all(boxes[:, 2:] - boxes[:, :2] + 1 >= 10)
        assert np.all(boxes[:, 2] <= im_info[c, 1] - 1) and np.all(boxes[:, 3] <= im_info[c, 0] - 1)
        height, width, scale = im_info[c]
        if height < 512 or width < 512:  # the coarsest scale: open upper end 512, flat maps beyond the image
            assert valid_ranges[c, 1] == 512 and valid_ranges[c, 0] == pytest.approx(120 * scale)
            rows = int(-(-height // 16))
            assert np.ptp(cls_prob[c, :, rows:], axis=(1, 2)).max() == 0 if rows < 32 else True
    again = random_target_inputs(np.random.default_rng(2), 12)
    assert all(np.array_equal(inputs[k], again[k]) for k in inputs)


def test_the_proposal_target_comparison_counts_per_chip_and_slot():
    from dev.parity.proposal_target import compare_proposal_targets

    rng = np.random.default_rng(0)
    theirs = {"rois": rng.uniform(0, 500, (600, 5)).astype(np.float32),
              "labels": rng.integers(0, 3, (2, 300)).astype(np.float32),
              "bbox_targets": rng.normal(0, 1, (600, 4)).astype(np.float32),
              "bbox_weights": np.repeat(rng.random((600, 1)) < 0.2, 4, axis=1).astype(np.float32)}
    inputs = {"cls_prob": np.zeros((2, 42, 32, 32))}
    rows = dict(compare_proposal_targets(inputs, theirs, {k: v.copy() for k, v in theirs.items()}))
    assert rows["chips with rois, labels, targets and weights all identical, slot by slot"] == "100.0% (2 / 2)"
    mine = {k: v.copy() for k, v in theirs.items()}
    mine["rois"][310, 2] += 2e-4  # chip 1, slot 10
    positive = np.flatnonzero(theirs["bbox_weights"][:300, 0])[0]
    mine["bbox_targets"][positive, 3] += 1e-5  # chip 0, a positive
    rows = dict(compare_proposal_targets(inputs, theirs, mine))
    assert rows["chips with rois, labels, targets and weights all identical, slot by slot"] == "0.0% (0 / 2)"
    assert rows["chips with identical rois (bit for bit) / within 1e-3 px; largest difference (px)"].startswith(
        "50.0% (1 / 2) / 100.0% (2 / 2); 0.0001")  # 2e-4 on a float32 near 250: 1.98e-4
    assert rows["chips with identical labels / weights"] == "100.0% (2 / 2) / 100.0% (2 / 2)"
    assert rows["chips with identical targets; largest difference on a positive"].startswith("50.0% (1 / 2); 1")


def test_the_proposal_target_tool_writes_inputs_and_compares_outputs(tmp_path, capsys):
    import runpy

    from dev.parity.proposal_target import project_targets

    tool = os.path.join(ROOT, "dev", "parity_proposal_target.py")
    inputs_file, outputs_file = str(tmp_path / "inputs.npz"), str(tmp_path / "fork.npz")
    module = runpy.run_path(tool, run_name="parity_tool")
    module["main"](["inputs", "--out", inputs_file, "--chips", "3", "--seed", "5"])
    with np.load(inputs_file) as data:
        inputs = {name: data[name] for name in data.files}
    np.savez(outputs_file, **project_targets(inputs))  # a stand-in for the fork's outputs: the project's own
    module["main"](["compare", "--inputs", inputs_file, "--fork-outputs", outputs_file])
    table = capsys.readouterr().out
    assert "MultiProposalTarget (3 random chips" in table and "| 100.0% (3 / 3) " in table
    with pytest.raises(SystemExit):
        module["main"](["compare", "--inputs", inputs_file, "--fork-outputs", inputs_file])


@pytest.mark.skipif(not FORK or not shutil.which("nvcc"), reason="SNIPER_FORK_DIR and nvcc are needed")
def test_the_fork_s_gpu_proposal_target_compiles_against_the_stand_ins(tmp_path):
    from dev.parity.fork import ForkCheckout

    operator = ForkCheckout(FORK).multi_proposal_target(str(tmp_path))  # running it needs a CUDA GPU
    assert hasattr(operator._lib, "harness_multi_proposal_target")


# ---- the mask network: the reference's own mask training graph against the project's ------------------------

def test_parameters_are_grouped_into_their_layer_families():
    from dev.parity.mask_network import grouped, layer_group

    assert [layer_group(name) for name in ("mask_conv_3x3_2_weight", "fc_new_1_bias", "stage4_unit3_offset_weight",
                                           "bn_data_gamma", "stage1_unit1_bn1_moving_var", "conv_new_1_weight",
                                           "mask_out_bias", "rpn_cls_score_weight")] == \
        ["mask_conv_3x3", "fc_new", "stage4", "bn_data", "stage1", "conv_new", "mask_out", "rpn_cls_score"]
    assert grouped(["fc_new_1_weight", "stage2_unit1_conv1_weight", "fc_new_2_bias"]) == "fc_new (2), stage2 (1)"
    assert grouped([]) == "-"


def _signature_pair():
    """Two small graphs: the second's ``conv0`` is 1x1 (not 3x3), its ``mask_conv_3x3_1`` runs in float16, it
    has one more layer ``extra`` and a second output."""
    import mxnet as mx

    x = mx.sym.var("x")
    project = mx.sym.Convolution(mx.sym.BatchNorm(mx.sym.Convolution(x, num_filter=4, kernel=(3, 3), pad=(1, 1),
                                                                     name="conv0"), name="bn0"),
                                 num_filter=2, kernel=(1, 1), name="mask_conv_3x3_1")
    hidden = mx.sym.BatchNorm(mx.sym.Convolution(x, num_filter=4, kernel=(1, 1), name="conv0"), name="bn0")
    hidden = mx.sym.Convolution(mx.sym.Cast(hidden, dtype="float16"), num_filter=2, kernel=(1, 1),
                                name="mask_conv_3x3_1")
    out = mx.sym.Convolution(mx.sym.Cast(hidden, dtype="float32"), num_filter=2, kernel=(1, 1), name="extra")
    return project, mx.sym.Group([out, mx.sym.BlockGrad(hidden)])


def test_signatures_count_names_shapes_and_types_and_name_what_differs():
    from dev.parity.mask_network import SIGNATURE_ROWS, signature_cells

    project, reference = _signature_pair()
    cells, differing = signature_cells(project, reference, {"x": (2, 3, 8, 8)})
    rows = dict(zip(SIGNATURE_ROWS, zip(cells, differing)))
    # parameters: 6 shared of 8 (extra's two only in the reference), conv0_weight (4, 3, 1, 1) against (4, 3, 3, 3)
    assert rows["parameter names identical (of both sides' names)"] == ("75.0% (6 / 8)", "reference only: extra (2)")
    assert rows["parameter shapes identical (shared names)"] == ("83.3% (5 / 6)", "conv0 (1)")
    assert rows["auxiliary state names identical"] == ("100.0% (2 / 2)", "-")
    assert rows["auxiliary state shapes identical (shared names)"] == ("100.0% (2 / 2)", "-")
    # types over the 7 shared arguments (x too): the float16 convolution's weight and bias, a documented difference
    assert rows[SIGNATURE_ROWS[4]] == ("71.4% (5 / 7)", "mask_conv_3x3 (2) (docs: fp16 casts of the mask branch)")
    assert rows[SIGNATURE_ROWS[5]] == ("1 / 2; differ", "[256] / [256, 256]")  # 2 x 2 x 8 x 8 each
    cells, differing = signature_cells(project, project, {"x": (2, 3, 8, 8)})
    assert cells[:5] == ["100.0% (6 / 6)"] * 2 + ["100.0% (2 / 2)"] * 2 + ["100.0% (7 / 7)"]
    assert differing == ["-"] * 6 and cells[5] == "1 / 1; identical"


def test_differences_are_absolute_and_relative_to_the_reference_s_largest_magnitude():
    from dev.parity.mask_network import difference

    assert difference(np.array([1, 2, 4], np.float32), np.array([[1, 2, 3]], np.float32)) == (False, 1.0, 1 / 3)
    assert difference(np.zeros(3), np.zeros((3, 1))) == (True, 0.0, 0.0)
    assert difference(np.ones(2), np.zeros(2)).rel == float("inf")
    with pytest.raises(ValueError, match="3 and 2 elements"):
        difference(np.zeros(3), np.zeros(2))


def _loss_graph(grad_scale, reshaped=False):
    """A small training graph: FC, batch norm, ReLU, FC, softmax loss with ``grad_scale``, and its scores twice,
    gradient-blocked: named ``scores_reshape`` (``reshaped``: as (2, 2, 3)) and ``scores`` (``reshaped``: unnamed)."""
    import mxnet as mx

    hidden = mx.sym.Activation(mx.sym.BatchNorm(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=6, name="fc1"),
                                                name="bn"), act_type="relu")
    scores = mx.sym.FullyConnected(hidden, num_hidden=3, name="fc2")
    loss = mx.sym.SoftmaxOutput(scores, label=mx.sym.var("label"), grad_scale=grad_scale, name="out")
    first = mx.sym.Reshape(scores, shape=(2, 2, 3)) if reshaped else scores
    return mx.sym.Group([loss, mx.sym.BlockGrad(first, name="scores_reshape"),
                         mx.sym.BlockGrad(scores, **({} if reshaped else {"name": "scores"}))])


def test_a_doubled_loss_gives_every_gradient_half_the_reference_s_at_equal_outputs():
    from dev.parity.mask_network import gradient_rows, output_rows, random_parameters, signature, training_step

    rng = np.random.default_rng(5)
    inputs = {"data": rng.normal(0, 1, (4, 5)).astype(np.float32), "label": np.array([0, 2, 1, 2], np.float32)}
    shapes = {name: value.shape for name, value in inputs.items()}
    reference = _loss_graph(2.0, reshaped=True)
    params, aux = random_parameters(rng, *signature(reference, shapes)[:2])
    assert set(params) == {"fc1_weight", "fc1_bias", "bn_gamma", "bn_beta", "fc2_weight", "fc2_bias"}
    assert params["fc2_weight"].dtype == np.float32
    assert np.all((params["bn_gamma"] >= 0.5) & (params["bn_gamma"] <= 1.5))
    theirs = training_step(reference, inputs, params, aux)
    halved, same = (training_step(_loss_graph(scale), inputs, params, aux) for scale in (1.0, 2.0))
    largest = max(float(np.abs(g).max()) for g in halved.gradients.values())
    zero = sum(not np.any(g) for g in halved.gradients.values())  # fc1's bias before the batch norm: none flows
    rows = {row[0]: row[1:] for row in gradient_rows([halved, same], theirs)}
    # scaling by 2 is exact: |g - 2g| = |g|, over max |2g| exactly one half; only all-zero gradients stay equal
    assert rows["every parameter"] == [6, f"{zero} / 6; {largest:.3g} / 0.5", "6 / 6; 0 / 0"]
    assert rows["`fc2`"][0] == 2 and rows["`fc2`"][1].endswith(" / 0.5") and rows["`fc2`"][2] == "2 / 2; 0 / 0"
    assert list(rows)[:3] == ["`fc1`", "`bn`", "`fc2`"]  # the reference's argument order
    # the forward is the same: outputs and the moving statistics after it
    assert rows["auxiliary states after the forward"] == [2, "2 / 2; 0 / 0", "2 / 2; 0 / 0"]
    loss, reshaped, unnamed = output_rows(_loss_graph(1.0).list_outputs(), reference.list_outputs(), [halved, same],
                                          theirs)
    assert loss == ["`out_output`", "(4, 3) / (4, 3)", "0 / 0", "0 / 0", "-"]
    assert reshaped == ["`scores_reshape_output`", "(4, 3) / (2, 2, 3)", "0 / 0", "0 / 0",
                        "reshaped in the reference (the same elements)"]
    assert unnamed == ["`scores_output`", "(4, 3) / (4, 3)", "0 / 0", "0 / 0", "an unnamed BlockGrad in the reference"]


def test_float32_mxnet_turns_only_the_casts_to_float16_into_casts_to_float32():
    import mxnet as mx

    from dev.parity.reference import float32_mxnet

    shim = float32_mxnet()
    x = mx.sym.var("x")
    for cast in (shim.sym.Cast(x, dtype=np.float16), shim.symbol.Cast(data=x, dtype="float16"),
                 shim.sym.Cast(x, dtype=np.float32)):
        assert cast.infer_type(x=np.float32)[1] == [np.float32]
    assert shim.sym.Cast(x, dtype=np.uint8).infer_type(x=np.float32)[1] == [np.uint8]
    assert shim.sym.FullyConnected is mx.sym.FullyConnected and shim.contrib is mx.contrib and shim.nd is mx.nd
    assert mx.sym.Cast(x, dtype=np.float16).infer_type(x=np.float32)[1] == [np.float16]  # MXNet itself unchanged


def test_random_mask_chips_are_the_loader_s_arrays_and_the_mask_target_reads_their_polygons():
    import mxnet as mx

    import lib.ops  # noqa: F401  (MaskRcnnTarget)
    from dev.parity.mask_network import input_shapes, project_mask_config, random_mask_chips

    shapes = input_shapes(project_mask_config(2, 128, False))
    assert shapes["gt_masks"] == (2, 100, 500) and shapes["label"] == (2, 21 * 8 * 8)
    inputs = random_mask_chips(np.random.default_rng(3), shapes, num_classes=81, gts=8)
    assert {name: value.shape for name, value in inputs.items()} == shapes
    labels = inputs["label"].reshape(2, 21, 8, 8)
    weights = inputs["bbox_weight"].reshape(2, 21, 4, 8, 8)
    np.testing.assert_array_equal(weights, np.repeat((labels == 1)[:, :, None], 4, axis=2))
    assert set(np.unique(labels)) == {-1, 0, 1}
    boxes, classes = inputs["gt_boxes"][:, :8, :4], inputs["gt_boxes"][:, :8, 4]
    assert np.all(inputs["gt_boxes"][:, 8:] == -1) and np.all(boxes == np.floor(boxes))
    assert np.all((boxes >= 0) & (boxes <= 127)) and np.all(boxes[..., 2:] - boxes[..., :2] >= 15)
    assert np.all((classes >= 1) & (classes <= 80))
    np.testing.assert_array_equal(inputs["gt_masks"][:, :8, 0], classes - 1)  # the category: the class - 1
    np.testing.assert_array_equal(inputs["gt_masks"][:, 8:], -1)
    # each gt's own box as its mask roi: its polygons fill part of the 28 x 28 cells, its class everywhere
    rois = np.concatenate([np.repeat([[0], [1]], 8, axis=0), boxes.reshape(-1, 4)], axis=1)
    targets, class_ids = (out.asnumpy() for out in mx.nd.MaskRcnnTarget(
        mx.nd.array(rois), mx.nd.array(inputs["gt_masks"]), mx.nd.array(np.tile(np.arange(8), 2)[:, None]),
        num_proposals=8, batch_size=2))
    filled = (targets == 1).mean(axis=(1, 2))
    assert np.all(filled > 0) and np.all(filled < 1) and np.all(np.isin(targets, (0, 1)))
    np.testing.assert_array_equal(class_ids[:, 0, 0], classes.reshape(-1) - 1)


def test_the_compare_tool_refuses_a_mask_chip_size_in_one_line(tmp_path, capsys):
    import runpy

    (tmp_path / "lib" / "chips").mkdir(parents=True)
    (tmp_path / "lib" / "chips" / "cchips.cpp").write_text("")  # a reference checkout as far as the tool looks
    tool = os.path.join(ROOT, "dev", "parity_compare.py")
    main = runpy.run_path(tool, run_name="parity_tool")["main"]
    for arguments, message in (
            (["--mask-chip-size", "200"], "--mask-chips 2 --mask-chip-size 200: config key TRAIN.CHIP_SIZE = 200: "
                                          "must be a multiple of the resnet101 features' stride (16)"),
            (["--mask-chips", "-1"], "--mask-chips -1 --mask-chip-size 192: 0 chips (no mask tables) or more"),
            (["--mask-chip-size", "48"], "of at least 64 px"),
            ([], "symbols/faster/resnet_mx_101_e2e_mask.py")):  # a checkout without the mask symbol file
        with pytest.raises(SystemExit):
            main(["--reference", str(tmp_path), *arguments])
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


def _git_checkout(path, marker):
    """A git repository at ``path`` with ``marker`` committed; its commit."""
    (path / marker).parent.mkdir(parents=True, exist_ok=True)
    (path / marker).write_text("int x;\n")
    git = ["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "c"], check=True)
    return subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_checkouts_other_than_the_pinned_commits_are_refused_or_warned_about(tmp_path):
    from dev.parity.fork import PROPOSAL_SOURCE, ForkCheckout
    from dev.parity.reference import FORK_COMMIT, REFERENCE_COMMIT, check_pinned, provenance_table

    commit = _git_checkout(tmp_path / "reference", "lib/chips/cchips.cpp")
    reference = ReferenceCheckout(str(tmp_path / "reference"))
    assert reference.commit() == (commit, False)
    with pytest.raises(FileNotFoundError, match=f"--reference {reference.path}: commit {commit[:12]} is not the "
                                                f"pinned {REFERENCE_COMMIT[:12]} .*; --any-commit compares it anyway"):
        check_pinned([reference], any_commit=False)
    (warning,) = check_pinned([reference], any_commit=True)
    assert warning.startswith("WARNING: --reference") and "\n" not in warning
    reference.pinned = commit  # as if this were the pinned commit: accepted, until a tracked file changes
    assert check_pinned([reference], any_commit=False) == []
    assert provenance_table(reference, None)[2] == [
        ["reference (mahyarnajibi/SNIPER)", f"{reference.path} at {commit[:12]} (pinned)", "no"],
        ["fork (mahyarnajibi/SNIPER-mxnet)", "not given: its tables left out", "-"]]
    (tmp_path / "reference" / "lib" / "chips" / "cchips.cpp").write_text("int y;\n")
    assert reference.commit() == (commit, True)
    with pytest.raises(FileNotFoundError, match="tracked files differ from the pinned commit"):
        check_pinned([reference], any_commit=False)
    # a bare clone: its HEAD; a copy without git (here a folder inside the first repository): no commit
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(tmp_path / "reference"), str(bare)], check=True)
    assert ReferenceCheckout(str(bare)).commit() == (commit, False)
    copy = tmp_path / "reference" / "copy"
    (copy / PROPOSAL_SOURCE).parent.mkdir(parents=True)
    (copy / PROPOSAL_SOURCE).write_text("")
    fork = ForkCheckout(str(copy))
    assert fork.commit() == (None, False) and fork.pinned == FORK_COMMIT
    with pytest.raises(FileNotFoundError, match=f"--fork {copy}: its commit cannot be read"):
        check_pinned([fork], any_commit=False)
    assert len(check_pinned([reference, fork], any_commit=True)) == 2


def test_the_compare_tool_refuses_another_commit_in_one_line(tmp_path, capsys):
    import runpy

    from dev.parity.reference import MASK_SYMBOL

    (tmp_path / MASK_SYMBOL).parent.mkdir(parents=True)
    (tmp_path / MASK_SYMBOL).write_text("")
    commit = _git_checkout(tmp_path, "lib/chips/cchips.cpp")
    tool = os.path.join(ROOT, "dev", "parity_compare.py")
    with pytest.raises(SystemExit):
        runpy.run_path(tool, run_name="parity_tool")["main"](["--reference", str(tmp_path)])
    assert f"commit {commit[:12]} is not the pinned 66d7d5bff7f2" in capsys.readouterr().err.strip().splitlines()[-1]


def test_figures_on_cpu_operators_name_the_thread_count(monkeypatch):
    from lib.benchmarking import thread_count

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert thread_count() == "OMP_NUM_THREADS 3"
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert thread_count() == f"OMP_NUM_THREADS unset (MXNet's default on {os.cpu_count()} cores)"


@pytest.mark.skipif(not REFERENCE, reason="SNIPER_REFERENCE_DIR (a checkout of the reference) is not set")
def test_the_new_layer_rules_tested_in_test_pretrained_are_the_reference_s_init_weight():
    """tests/train/test_pretrained.py checks the new layers against rules transcribed from the reference's
    init_weight_rcnn / init_weight_mask: here those rules are read from its symbol files."""
    import re

    from network_helpers import REFERENCE_AUTO_FOCUS_NORMAL_001, REFERENCE_MASK_NORMAL_001, REFERENCE_NORMAL_001

    reference = ReferenceCheckout(REFERENCE)
    normal = re.compile(r"arg_params\['([\w{}]+)_(weight|bias)'(?:\.format\(i ?\+ ?1\))?\] = "
                        r"mx\.random\.normal\(0, 0\.01")
    found = {}
    for path in ("symbols/faster/resnet_mx_101_e2e.py", "symbols/faster/resnet_mx_101_e2e_mask.py"):
        text = reference.read(path)
        body = text[text.index("def init_weight_rcnn"):text.index("def init_weight_rpn")]
        if "def init_weight_mask" in text:
            body += text[text.index("def init_weight_mask"):text.index("def init_weight_rcnn")]
        found[path] = {name.replace("{}", str(i)) for name, kind in normal.findall(body)
                       for i in (range(1, 5) if "{}" in name else [0])}
        assert all(kind == "weight" for _, kind in normal.findall(body))  # every bias: mx.nd.zeros
    expected = REFERENCE_NORMAL_001 | REFERENCE_AUTO_FOCUS_NORMAL_001
    assert found["symbols/faster/resnet_mx_101_e2e.py"] == expected
    assert found["symbols/faster/resnet_mx_101_e2e_mask.py"] == expected | REFERENCE_MASK_NORMAL_001
