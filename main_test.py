"""Test SNIPER: ``python main_test.py --cfg FILE [--set KEY VALUE ...]``.

Runs the multi-scale tester on ``dataset.test_image_set`` (results JSON + COCO/VOC evaluation under
``{output_path}/{name}/results/``), or, with ``--set TEST.EXTRACT_PROPOSALS true``, extracts RPN
proposals of ``dataset.image_set`` for negative chip mining.
"""
from lib.bootstrap import use_project_python

if __name__ == "__main__":
    use_project_python()  # before any third-party import: re-runs this in .venv when another Python started it

import argparse
import logging

from lib.config import add_config_arguments, config_from_arguments, dump_config
from lib.logger import logged_outcome, setup_logging


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = config_from_arguments(args)
    from lib.inference.tester import extract_proposals, test
    from lib.train.checkpoint import output_dir

    setup_logging(output_dir(cfg), name="test")
    with logged_outcome("proposal extraction" if cfg.TEST.EXTRACT_PROPOSALS else "testing"):
        logging.getLogger(__name__).info("config %s with overrides %s:\n%s", args.cfg, args.set, dump_config(cfg))
        if cfg.TEST.EXTRACT_PROPOSALS:
            extract_proposals(cfg)
        else:
            test(cfg)


if __name__ == "__main__":
    main()
