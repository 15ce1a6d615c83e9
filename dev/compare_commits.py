"""Train and test two commits side by side and compare them exactly (dev/commit_comparison.py).

    python dev/compare_commits.py COMMIT_A COMMIT_B [--work DIR]

Both train the tiny synthetic config for one short epoch on a few generated images and test it; the
losses of every batch, the checkpoint's parameters and the test detections must be identical for a
change that should not alter behaviour (exit status 1 otherwise). Worktrees, data and runs go to
``--work`` (default ``output/compare_commits``); remove its worktrees with ``git worktree remove``.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))  # _bootstrap
import _bootstrap  # noqa: F401,E402  (repository root on sys.path, the project's virtualenv)

from dev.commit_comparison import compare_commits  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("commit_a")
    parser.add_argument("commit_b")
    parser.add_argument("--work", default=os.path.join(ROOT, "output", "compare_commits"),
                        help="folder for the two worktrees, their data and runs")
    args = parser.parse_args(argv)
    result = compare_commits(ROOT, args.commit_a, args.commit_b, os.path.abspath(args.work))
    print(json.dumps(result, indent=1))
    identical = result["losses_identical"] and result["params_identical"] and result["detections_identical"]
    print("identical" if identical else f"DIFFERENT: first at {result['first_difference']}")
    sys.exit(0 if identical else 1)


if __name__ == "__main__":
    main()
