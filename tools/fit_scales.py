"""Fit the training pyramid (scales, valid ranges, anchors if needed) to a dataset's object sizes.

    python tools/fit_scales.py --cfg FILE [--set KEY VALUE ...] [--keep 0.98] [--max-images 500]
                               [--max-factor 4] [--out PATH]

Reads the config's training set (any dataset the project loads), mines one epoch with the real chip
generator for the config's pyramid and for candidates built from the box sizes, prints per candidate
the share of boxes kept (valid in a chip at a size the anchors match), chips per image, pixels against
single-scale training and the object sizes in chip pixels, and writes the cheapest pyramid keeping
``--keep`` of the boxes as ``FILE_fitted.yml`` beside the config, with every ``--set`` key it was fitted with
(rule: lib/scales_fit.py, docs/datasets.md#fitting-the-scales-to-your-data).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import sys

from lib.config import add_config_arguments, config_from_arguments
from lib.config.core import parse_cli_overrides
from lib.logger import report_user_errors, setup_logging
from lib.scales_fit import DEFAULT_KEEP, DEFAULT_MAX_FACTOR, DEFAULT_MAX_IMAGES, FitError, fit_dataset, report, \
    schedule_text, write_fitted_config


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.add_argument("--keep", type=float, default=DEFAULT_KEEP, help="share of boxes to keep (default 0.98)")
    parser.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES,
                        help=f"images sampled for the fit (0: all; default {DEFAULT_MAX_IMAGES})")
    parser.add_argument("--max-factor", type=float, default=DEFAULT_MAX_FACTOR,
                        help="largest image enlargement; smaller objects get smaller anchors (default 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="", help="output YAML (default: FILE_fitted.yml beside the config)")
    args = parser.parse_args()
    cfg = config_from_arguments(args)
    setup_logging()
    try:
        fit = fit_dataset(cfg, args.keep, args.max_images, args.max_factor, args.seed)
    except FitError as err:
        sys.exit(f"fit_scales: {err}")
    print(f"well sized with the proposal's anchors: {fit.band.low:.1f} (finest scale) or {fit.band.comfortable:.1f} "
          f"(the others) to {fit.band.high:.0f} chip px (sqrt area; each candidate is scored with its own); "
          f"trainable (valid under some candidate): {100 * fit.trainable:.1f}% of the boxes; * = proposal")
    print(report(fit))
    if not fit.meets_keep:
        print(f"no candidate keeps {100 * args.keep:.0f}% of the trainable boxes: the proposal keeps the most")
    print(schedule_text(cfg, fit))
    print(f"wrote {write_fitted_config(args.cfg, cfg, fit, args.out or None, parse_cli_overrides(args.set))}")


if __name__ == "__main__":
    main()
