"""Times the compiled MultiProposalTarget operator in both rule sets against its NumPy reference
(dev/oracles/proposal_target.py).

One training batch: 16 chips of 512x512, 21 anchors on a 32x32 stride-16 feature map, up to 100 gt
rows per chip (about 20 real) and the three training valid ranges in the loader's encoding (0 / 512
for open ends). Kinds of RPN output:

* random: sigmoid of random logits, random deltas (an untrained RPN: few boxes overlap);
* trained: scores high and deltas pointing at the gts near them, every other chip's scores rounded to
  1/64 (a trained RPN: many near-duplicate boxes, so NMS visits many candidates; exact score ties);
* equal (with ``--kinds``): every score 0.5, random deltas (a collapsed RPN: the worst case of the
  reference rules' tie order; the NumPy references then take minutes: ``--numpy-repeat 0`` skips them).

Rows: the published settings (reference rules, every proposal into NMS), the exact rules without
and with the 6000 pre-NMS cap (the project's earlier default), stock ``mx.nd.contrib.MultiProposal``
(proposals only: no gt appending, labels or targets; 6000 into NMS) as a yardstick for the decode +
NMS part, and the NumPy reference of each rule set. "agree" checks the operator's labels equal the
NumPy reference's and its rois are within 1e-3 px.

    python tools/benchmark_proposal_target.py [--repeat 5] [--batch 16] [--numpy-repeat 1] [--kinds random,trained]
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse

import mxnet as mx
import numpy as np

import lib.ops
from lib.benchmarking import markdown_table, measure
from lib.boxes import base_anchors, bbox_overlaps, encode, grid_anchors
from lib.config import load_config
from lib.logger import report_user_errors
from dev.oracles.proposal_target import multi_proposal_target
from symbols.backbones import feature_stride

PUBLISHED = load_config(None)
ATTRS = lib.ops.proposal_target_attrs(PUBLISHED, feature_stride(PUBLISHED))  # the published settings
CHIP, STRIDE, FEAT = 512, ATTRS["feature_stride"], 32
VALID_RANGES = [[0, 80 * 3.0], [32 * 1.667, 150 * 1.667], [120 * 0.4, CHIP]]  # chip pixels per scale
VARIANTS = [
    ("reference rules, no pre-NMS cap (published)", {}),
    ("exact rules, no pre-NMS cap", {"rules": "exact"}),
    ("exact rules, 6000 pre-NMS (earlier default)", {"rules": "exact", "rpn_pre_nms_top_n": 6000}),
]


def chip_gts(rng):
    gt_boxes = np.full((100, 5), -1, np.float32)
    num = rng.integers(5, 35)
    corner = rng.uniform(0, CHIP - 16, (num, 2))
    size = np.exp(rng.uniform(np.log(12), np.log(400), (num, 1))) * rng.uniform(0.5, 2, (num, 2)) ** 0.5
    gt_boxes[:num, :2] = corner
    gt_boxes[:num, 2:4] = np.minimum(corner + size, CHIP - 1)
    gt_boxes[:num, 4] = rng.integers(1, 81, num)
    return gt_boxes


def rpn_outputs(rng, gt_boxes, kind, num_anchors, anchors):
    """(2A, H, W) scores and (4A, H, W) deltas of one chip."""
    logits = rng.normal(0, 2, len(anchors)) if kind != "equal" else np.zeros(len(anchors))
    deltas = rng.normal(0, 0.2, (len(anchors), 4))
    if kind == "trained":
        gts = gt_boxes[gt_boxes[:, 4] >= 0, :4]
        overlaps = bbox_overlaps(anchors, gts)
        best = overlaps.argmax(axis=1)
        best_overlap = overlaps.max(axis=1)
        logits = -3 + 8 * best_overlap + rng.normal(0, 0.5, len(anchors))
        near = best_overlap > 0.3
        deltas[near] = 0.8 * encode(anchors[near], gts[best[near]]) + rng.normal(0, 0.05, (near.sum(), 4))
    fg = (1 / (1 + np.exp(-logits))).reshape(FEAT, FEAT, num_anchors).transpose(2, 0, 1)
    cls_prob = np.concatenate([1 - fg, fg]).astype(np.float32)
    bbox_pred = deltas.reshape(FEAT, FEAT, num_anchors, 4).transpose(2, 3, 0, 1).reshape(-1, FEAT, FEAT)
    return cls_prob, bbox_pred.astype(np.float32)


def batch_inputs(rng, batch, kind):
    anchors = grid_anchors(base_anchors(STRIDE, ATTRS["ratios"], ATTRS["scales"]), FEAT, FEAT, STRIDE)
    num_anchors = len(anchors) // (FEAT * FEAT)
    gt_boxes = np.stack([chip_gts(rng) for _ in range(batch)])
    outputs = [rpn_outputs(rng, gt_boxes[b], kind, num_anchors, anchors) for b in range(batch)]
    cls_prob = np.stack([o[0] for o in outputs])
    if kind == "trained":
        cls_prob[1::2] = np.round(cls_prob[1::2] * 64) / 64
    bbox_pred = np.stack([o[1] for o in outputs])
    im_info = np.tile(np.float32([CHIP, CHIP, 1.0]), (batch, 1))
    valid_ranges = np.float32([VALID_RANGES[b % 3] for b in range(batch)])
    return cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--numpy-repeat", type=int, default=1, help="rounds for the (slow) NumPy references, 0: skip")
    parser.add_argument("--kinds", default="random,trained", help="RPN outputs: random, trained, equal")
    args = parser.parse_args()

    rows = []
    for kind in args.kinds.split(","):
        if kind not in ("random", "trained", "equal"):
            parser.error(f"--kinds: unknown kind {kind!r} (random, trained, equal)")
        inputs = batch_inputs(np.random.default_rng(0), args.batch, kind)
        nd_inputs = [mx.nd.array(x) for x in inputs]

        def operator(attrs):
            outputs = mx.nd.MultiProposalTarget(*nd_inputs, **attrs)
            mx.nd.waitall()
            return [out.asnumpy() for out in outputs]

        def stock_proposals():
            mx.nd.contrib.MultiProposal(
                nd_inputs[0], nd_inputs[1], nd_inputs[2], feature_stride=STRIDE, scales=ATTRS["scales"],
                ratios=ATTRS["ratios"], rpn_pre_nms_top_n=6000, rpn_post_nms_top_n=ATTRS["rpn_post_nms_top_n"],
                threshold=ATTRS["threshold"], rpn_min_size=ATTRS["rpn_min_size"])
            mx.nd.waitall()

        for name, overrides in VARIANTS:
            attrs = {**ATTRS, **overrides}
            compiled = measure(lambda: operator(attrs), args.repeat)
            numpy_ms = agree = None
            if args.numpy_repeat:
                numpy_timing = measure(lambda: multi_proposal_target(*inputs, **attrs), args.numpy_repeat)
                ours, ref = compiled.result, numpy_timing.result
                numpy_ms = numpy_timing.best * 1e3
                agree = "yes" if np.array_equal(ours[1], ref[1]) and np.abs(ours[0] - ref[0]).max() <= 1e-3 else "NO"
            rows.append((kind, name, *milliseconds(compiled, args.batch), numpy_ms, agree))
        rows.append((kind, "stock contrib.MultiProposal (proposals only, 6000)",
                     *milliseconds(measure(stock_proposals, args.repeat), args.batch), None, None))
    print(f"batch of {args.batch} chips {CHIP}x{CHIP}, A=21, H=W={FEAT}; best of {args.repeat} "
          f"(NumPy: {args.numpy_repeat}), MXNet CPU, 1 process; CPU = process CPU time (steadier on a shared machine)")
    print(markdown_table(["RPN output", "operator", "ms/batch", "CPU ms/batch", "CPU ms/chip", "NumPy ms/batch",
                          "agree"], rows, [None, None, ".1f", ".1f", ".2f", ".0f", None]))


def milliseconds(timing, batch):
    """Best wall and CPU time per batch, CPU time per chip."""
    cpu = min(timing.cpu_seconds)
    return timing.best * 1e3, cpu * 1e3, cpu * 1e3 / batch


if __name__ == "__main__":
    main()
