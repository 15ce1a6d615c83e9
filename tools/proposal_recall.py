"""Recall of a proposal file on its image set (IoU 0.5 and 0.7; all gts, COCO size classes, each training
scale's valid range): judge the RPN stage's proposals before negative chips are mined from them.

    python tools/proposal_recall.py --cfg FILE [--proposals FILE.npz] [--image-set NAME] [--set KEY VALUE ...]

Defaults: ``dataset.proposal`` on ``dataset.image_set``. Crowd regions are not counted; images without
proposals count as missed.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse

import numpy as np

from lib.benchmarking import markdown_table
from lib.config import add_config_arguments, config_from_arguments
from lib.dataset import load_roidb
from lib.dataset.proposals import read_proposals
from lib.evaluation.metrics import proposal_recall
from lib.logger import report_user_errors, setup_logging

COCO_SIZES = {"all": (-1, -1), "small (< 32 px)": (-1, 32), "medium (32-96 px)": (32, 96), "large (>= 96 px)": (96, -1)}


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_arguments(parser)
    parser.add_argument("--proposals", help="proposal file (.npz); default dataset.proposal")
    parser.add_argument("--image-set", help="image set; default dataset.image_set")
    args = parser.parse_args(argv)
    cfg = config_from_arguments(args)
    setup_logging()
    path = args.proposals or cfg.dataset.proposal
    if not path:
        parser.error("no proposal file: give --proposals or set dataset.proposal")
    roidb, _ = load_roidb(cfg, args.image_set or cfg.dataset.image_set, training=False)
    proposals = read_proposals(path)
    empty = np.zeros((0, 4), np.float32)
    ranges = dict(COCO_SIZES)
    for index, (lo, hi) in enumerate(cfg.TRAIN.VALID_RANGES):
        ranges[f"training scale {index} range [{lo}, {hi})"] = (lo, hi)
    table = proposal_recall([entry["boxes"] for entry in roidb],
                            [proposals.get(entry["id"], empty) for entry in roidb], ranges)
    rows = [[name, values["gts"], values[0.5], values[0.7]] for name, values in table.items()]
    print(f"proposal recall of {path} on {len(roidb)} images ({sum(1 for e in roidb if e['id'] in proposals)} "
          f"with proposals)\n")
    print(markdown_table(["gts", "count", "recall@0.5", "recall@0.7"], rows, [None, None, ".3f", ".3f"]))


if __name__ == "__main__":
    main()
