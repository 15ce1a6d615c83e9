"""Convert a legacy pickled proposal file (the reference's published ones) to the project's ``.npz``.

    python tools/convert_proposals.py IN.pkl OUT.npz

Training refuses pickled proposal files because unpickling runs whatever code the file names. Running
this converter is the explicit opt-in to unpickle IN.pkl once: do it only for a file whose source you
trust. Keys may be image ids or image file names ending in the id (``COCO_train2014_000000000009.jpg``).
The format of OUT.npz is described in lib/dataset/proposals.py.
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse
import logging
import sys

from lib.dataset.proposals import convert_pickle
from lib.logger import report_user_errors, setup_logging

logger = logging.getLogger("convert_proposals")


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", metavar="IN.pkl", help="legacy pickle {image id or file name: (P, 5) array}")
    parser.add_argument("target", metavar="OUT.npz", help="proposal file to write (dataset.proposal)")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        count = convert_pickle(args.source, args.target)
    except (OSError, ValueError) as err:
        sys.exit(f"error: {err}")
    logger.info("wrote proposals of %d images to %s", count, args.target)


if __name__ == "__main__":
    main()
