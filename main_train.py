"""Train SNIPER: ``python main_train.py --cfg FILE [--set KEY VALUE ...] [--resume] [--eval]``."""
import argparse
import logging
import sys

from lib.config import ConfigError, dump_config, load_config, parse_cli_overrides
from lib.logger import setup_logging


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cfg", required=True, help="YAML config, e.g. configs/faster/sniper_res101_e2e.yml")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY VALUE",
                        help="override config keys, e.g. --set TRAIN.BATCH_IMAGES 8 gpus 0,1")
    parser.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint")
    parser.add_argument("--eval", action="store_true", help="evaluate the final checkpoint on the test image set")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    try:
        cfg = load_config(args.cfg, parse_cli_overrides(args.set))
    except (ConfigError, ValueError) as err:
        sys.exit(f"config error: {err}")
    from lib.train.distributed import Workers, create_kvstore
    from lib.train.trainer import output_dir, train

    try:
        kvstore = create_kvstore(cfg)  # with dist_sync: joins the job started by tools/launch.py
    except ValueError as err:
        sys.exit(f"config error: {err}")
    workers = Workers(kvstore)
    with workers.exit_at_once_on_error():
        setup_logging(output_dir(cfg), name=f"train_rank{workers.rank}" if workers.distributed else "train")
        logging.getLogger(__name__).info("config %s with overrides %s:\n%s", args.cfg, args.set, dump_config(cfg))
        train(cfg, resume=args.resume, kvstore=kvstore)
        if args.eval and workers.rank == 0:
            from lib.test.tester import test

            test(cfg)


if __name__ == "__main__":
    main()
