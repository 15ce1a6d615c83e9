"""Times the compiled MultiProposalTarget operator against its NumPy reference (lib/ops/reference.py).

One training batch: 16 chips of 512x512, 21 anchors on a 32x32 stride-16 feature map, up to 100 gt
rows per chip (about 20 real, mixed valid/invalid) and the three training valid ranges. Stock
``mx.nd.contrib.MultiProposal`` (proposals only: no gt appending, labels or targets) is timed too as a
yardstick for the decode + NMS part. The "agree" column checks the operator's labels equal the
reference's and its rois are within 1e-3 px.

    python tools/benchmark_proposal_target.py [--repeat 5] [--batch 16]
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse

import mxnet as mx
import numpy as np

import lib.ops
from lib.benchmarking import markdown_table, measure
from lib.config import load_config
from lib.ops.reference import multi_proposal_target

ATTRS = lib.ops.proposal_target_attrs(load_config(None))  # the published settings
CHIP, STRIDE, FEAT = 512, ATTRS["feature_stride"], 32
VALID_RANGES = [[-1, 80 * 3.0], [32 * 1.667, 150 * 1.667], [120 * 0.4, -1]]  # chip pixels per scale


def batch_inputs(rng, batch):
    num_anchors = len(ATTRS["scales"]) * len(ATTRS["ratios"])
    logits = rng.normal(0, 2, (batch, 2, num_anchors, FEAT, FEAT))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    cls_prob = probs.reshape(batch, 2 * num_anchors, FEAT, FEAT).astype(np.float32)
    bbox_pred = rng.normal(0, 0.2, (batch, 4 * num_anchors, FEAT, FEAT)).astype(np.float32)
    im_info = np.tile(np.float32([CHIP, CHIP, 1.0]), (batch, 1))
    gt_boxes = np.full((batch, 100, 5), -1, np.float32)
    for b in range(batch):
        num = rng.integers(5, 35)
        corner = rng.uniform(0, CHIP - 16, (num, 2))
        size = np.exp(rng.uniform(np.log(12), np.log(400), (num, 1))) * rng.uniform(0.5, 2, (num, 2)) ** 0.5
        gt_boxes[b, :num, :2] = corner
        gt_boxes[b, :num, 2:4] = np.minimum(corner + size, CHIP - 1)
        gt_boxes[b, :num, 4] = rng.integers(1, 81, num)
    valid_ranges = np.float32([VALID_RANGES[b % 3] for b in range(batch)])
    return cls_prob, bbox_pred, im_info, gt_boxes, valid_ranges


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()

    inputs = batch_inputs(np.random.default_rng(0), args.batch)
    nd_inputs = [mx.nd.array(x) for x in inputs]

    def operator():
        outputs = mx.nd.MultiProposalTarget(*nd_inputs, **ATTRS)
        mx.nd.waitall()
        return outputs

    def stock_proposals():
        mx.nd.contrib.MultiProposal(
            nd_inputs[0], nd_inputs[1], nd_inputs[2], feature_stride=STRIDE, scales=ATTRS["scales"],
            ratios=ATTRS["ratios"], rpn_pre_nms_top_n=ATTRS["rpn_pre_nms_top_n"],
            rpn_post_nms_top_n=ATTRS["rpn_post_nms_top_n"], threshold=ATTRS["threshold"],
            rpn_min_size=ATTRS["rpn_min_size"],
        )
        mx.nd.waitall()

    def reference():
        return multi_proposal_target(*inputs, **ATTRS)

    ours = [out.asnumpy() for out in operator()]
    ref = reference()
    agree = np.array_equal(ours[1], ref[1]) and np.abs(ours[0] - ref[0]).max() <= 1e-3

    timed = [
        ("MultiProposalTarget (compiled)", measure(operator, args.repeat).best, "yes" if agree else "NO"),
        ("contrib.MultiProposal (stock, proposals only)", measure(stock_proposals, args.repeat).best, None),
        ("NumPy reference (lib.boxes)", measure(reference, max(1, args.repeat // 2)).best, None),
    ]
    base = timed[-1][1]
    print(f"batch of {args.batch} chips {CHIP}x{CHIP}, A=21, H=W={FEAT}, "
          f"{int((inputs[3][..., 4] >= 0).sum())} real gts; best of {args.repeat} (MXNet CPU, 1 process)")
    rows = [(name, seconds * 1e3, seconds * 1e3 / args.batch, f"{base / seconds:.1f}x", agreement)
            for name, seconds, agreement in timed]
    print(markdown_table(["implementation", "ms/batch", "ms/chip", "vs NumPy", "agree"], rows,
                         [None, ".1f", ".2f", None, None]))


if __name__ == "__main__":
    main()
