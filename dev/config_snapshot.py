"""Write the effective values of every shipped config (configs/faster/*.yml) as JSON, for
tests/config/test_config.py's check that rewriting the configs (``_BASE_`` inheritance) changed no value.

    python dev/config_snapshot.py tests/data/shipped_config_snapshot.json

Run once, at the commit before a rewrite of the shipped configs; the test compares every key with it. Each
config is written as its differences from the defaults (written once), to keep the file small.
"""
import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))  # _bootstrap
import _bootstrap  # noqa: F401,E402  (repository root on sys.path, the project's virtualenv)

from lib.config import load_config  # noqa: E402
from lib.config.core import flat_config  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", help="the JSON file to write: {defaults: {dotted.key: value}, configs: "
                                       "{config file name: {dotted.key: value where it is not the default}}}")
    args = parser.parse_args(argv)
    defaults = flat_config(load_config(None))
    configs = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "faster", "*.yml"))):
        values = flat_config(load_config(path))
        assert sorted(values) == sorted(defaults), path  # every config has every key: only the values differ
        configs[os.path.basename(path)] = {key: value for key, value in values.items()
                                           if json.dumps(value) != json.dumps(defaults[key])}
    snapshot = {"defaults": defaults, "configs": configs}
    with open(args.output, "w") as f:
        json.dump(snapshot, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
