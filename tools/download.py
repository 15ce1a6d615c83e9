"""Download the reference's published files, verify their SHA-256 and install them in the project's formats.

    python tools/download.py pretrained|detectors|proposals|all [--dest DIR] [--sha256 HEX] [--no-verify]

``pretrained``: its pretrained backbones into data/pretrained_model/; ``detectors``: its trained SNIPER and
AutoFocus detectors into output/; ``proposals``: its negative-chip proposals into data/proposals/ (converted
to .npz). No checksum is recorded for them yet (they could not be fetched where this tool was written): give
one you trust with --sha256, or take the file as it comes with --no-verify (its SHA-256 is printed; its
pickled proposals are then not converted). A download that fails, is cut short or has another checksum
installs nothing (lib/downloads.py).
"""
import _bootstrap  # noqa: F401  (repository root on sys.path, the project's virtualenv)
import argparse

from lib.downloads import ARTIFACTS, install
from lib.logger import report_user_errors, setup_logging


@report_user_errors  # a user's mistake (lib/errors.py) in one line, a defect with its traceback
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=[*ARTIFACTS, "all"], help="which archive")
    parser.add_argument("--dest", help="install under this folder instead of the archive's place in the repository")
    parser.add_argument("--sha256", default="", help="the archive's SHA-256 (hex), from a source you trust")
    parser.add_argument("--no-verify", action="store_true", help="install an archive whose checksum is not known")
    args = parser.parse_args(argv)
    names = list(ARTIFACTS) if args.what == "all" else [args.what]
    if args.sha256 and len(names) > 1:
        parser.error("--sha256 is one archive's checksum: name that archive instead of 'all'")
    setup_logging()
    for name in names:
        installed = install(ARTIFACTS[name], args.dest, args.sha256, verify=not args.no_verify)
        print(f"{name}: installed {len(installed)} files")
        for path in installed:
            print(f"  {path}")


if __name__ == "__main__":
    main()
