"""Test SNIPER: ``python main_test.py --cfg FILE [--set KEY VALUE ...]``.

Runs the multi-scale tester on ``dataset.test_image_set`` (results JSON + COCO/VOC evaluation under
``{output_path}/{name}/results/``), or, with ``--set TEST.EXTRACT_PROPOSALS true``, extracts RPN
proposals of ``dataset.image_set`` for negative chip mining.
"""
import argparse
import logging
import os
import sys

from lib.config import ConfigError, load_config, parse_cli_overrides
from lib.logger import setup_logging


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cfg", required=True, help="YAML config, e.g. configs/faster/sniper_res101_e2e.yml")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY VALUE",
                        help="override config keys, e.g. --set TEST.MODEL out/SNIPER-0007.params gpus 0,1")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        cfg = load_config(args.cfg, parse_cli_overrides(args.set))
    except (ConfigError, ValueError) as err:
        sys.exit(f"config error: {err}")
    from lib.test.tester import extract_proposals, test

    setup_logging(os.path.join(cfg.output_path, cfg.name), name="test")
    logging.getLogger(__name__).info("config %s:\n%s", args.cfg, cfg)
    if cfg.TEST.EXTRACT_PROPOSALS:
        extract_proposals(cfg)
    else:
        test(cfg)


if __name__ == "__main__":
    main()
