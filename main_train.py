"""Train SNIPER: ``python main_train.py --cfg FILE [--set KEY VALUE ...] [--resume | --overwrite] [--eval]``."""
from lib.bootstrap import use_project_python

if __name__ == "__main__":
    use_project_python()  # before any third-party import: re-runs this in .venv when another Python started it

import argparse

from lib.config import add_config_arguments, config_from_arguments
from lib.config.core import dump_config
from lib.logger import log_config, logged_outcome, report_user_errors, setup_logging


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    add_config_arguments(parser)
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint")
    start.add_argument("--overwrite", action="store_true",
                       help="start over in a run folder that holds checkpoints of this config: their epoch files, "
                            "evaluations and the results/ are first moved to {output_path}/{name}/replaced_TIME/")
    parser.add_argument("--eval", action="store_true",
                        help="evaluate the final checkpoint on the test image set (with TRAIN.EVAL_EVERY: the best)")
    return parser.parse_args(argv)


@report_user_errors  # a user's mistake (lib/errors.py) in one line, before and after logging starts
def main(argv=None):
    args = parse_args(argv)
    cfg = config_from_arguments(args)
    from lib.start_checks import check_training_start
    from lib.train.distributed import Workers, create_kvstore
    from lib.run.checkpoint import output_dir
    from lib.train.trainer import train

    check_training_start(cfg, args.resume, args.overwrite, args.eval)  # what can fail before any work: nothing written
    kvstore = create_kvstore(cfg)  # with dist_sync: joins the job started by tools/launch.py
    workers = Workers(kvstore)
    with workers.exit_at_once_on_error():
        setup_logging(output_dir(cfg), name=f"train_rank{workers.rank}" if workers.distributed else "train")
        with logged_outcome("training"):
            log_config(args.cfg, args.set, dump_config(cfg))
            prefix, _ = train(cfg, resume=args.resume, kvstore=kvstore, overwrite=args.overwrite)
            if args.eval and workers.rank == 0:
                from lib.run.checkpoint import last_complete_epoch, params_path
                from lib.run.folder import best_checkpoint
                from lib.train.evaluation import final_test

                # The best epoch of the evaluations while training (TRAIN.EVAL_EVERY), else the last checkpoint
                # written (an early stop ends before TRAIN.end_epoch), whatever TEST.TEST_EPOCH / TEST.MODEL say
                # (they serve main_test.py); one those evaluations tested on the whole set is not tested again.
                final_test(cfg, best_checkpoint(output_dir(cfg)) or params_path(prefix, last_complete_epoch(prefix)))


if __name__ == "__main__":
    main()
