"""Train SNIPER: ``python main_train.py --cfg FILE [--set KEY VALUE ...] [--resume | --overwrite] [--eval]``."""
from lib.bootstrap import use_project_python

if __name__ == "__main__":
    use_project_python()  # before any third-party import: re-runs this in .venv when another Python started it

import argparse
import logging
import sys

from lib.config import add_config_arguments, config_from_arguments, dump_config
from lib.logger import logged_outcome, setup_logging


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    add_config_arguments(parser)
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint")
    start.add_argument("--overwrite", action="store_true",
                       help="start over in a run folder that holds checkpoints of this config: their epoch files "
                            "are first moved to {output_path}/{name}/replaced_TIME/")
    parser.add_argument("--eval", action="store_true",
                        help="evaluate the final checkpoint on the test image set (with TRAIN.EVAL_EVERY: the best)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = config_from_arguments(args)
    from lib.train.distributed import Workers, create_kvstore
    from lib.run.checkpoint import CheckpointError, output_dir
    from lib.train.pretrained import PretrainedError
    from lib.run.lock import RunFolderError
    from lib.train.evaluation import EvaluationError
    from lib.train.trainer import TrainingDiverged, train

    try:
        kvstore = create_kvstore(cfg)  # with dist_sync: joins the job started by tools/launch.py
    except ValueError as err:
        sys.exit(f"config error: {err}")
    workers = Workers(kvstore)
    with workers.exit_at_once_on_error():
        setup_logging(output_dir(cfg), name=f"train_rank{workers.rank}" if workers.distributed else "train")
        with logged_outcome("training"):
            logging.getLogger(__name__).info("config %s with overrides %s:\n%s", args.cfg, args.set, dump_config(cfg))
            try:  # a run folder in use, a missing or foreign data folder, checkpoint or pretrained file: one line
                prefix, _ = train(cfg, resume=args.resume, kvstore=kvstore, overwrite=args.overwrite)
                if args.eval and workers.rank == 0:
                    from lib.inference.tester import test
                    from lib.run.checkpoint import last_complete_epoch, params_path
                    from lib.run.folder import best_checkpoint

                    # The best epoch of the evaluations while training (TRAIN.EVAL_EVERY), else the last checkpoint
                    # written (an early stop ends before TRAIN.end_epoch), whatever TEST.TEST_EPOCH / TEST.MODEL say
                    # (they serve main_test.py).
                    test(cfg, checkpoint=best_checkpoint(output_dir(cfg)) or
                         params_path(prefix, last_complete_epoch(prefix)))
            except (RunFolderError, FileNotFoundError, FileExistsError, CheckpointError, PretrainedError,
                    TrainingDiverged, EvaluationError) as err:
                sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
