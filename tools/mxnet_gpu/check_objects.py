"""Check that CUDA objects or libraries carry sm_90 machine code (dev/cuda_kernels.py reads them offline).

    python tools/mxnet_gpu/check_objects.py FILE...

prints one line per file, e.g. ``convolution.cu.o: sm_90 (SASS sm_90, PTX compute_90)``, and exits 1 when a
file is missing, is not an ELF file, or has a fat binary without sm_90 SASS (a library links one per CUDA
unit: each must have it, or that unit's kernels cannot run on the GPU).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from dev.cuda_kernels import KIND_SASS, architectures, fat_binaries, fatbin_section  # noqa: E402

ARCH = 90


def describe(path, arch=ARCH):
    """``(ok, line)`` for one file."""
    try:
        archs = architectures(path)
        binaries = fat_binaries(fatbin_section(path) or b"")
    except (OSError, ValueError) as error:
        return False, f"{path}: FAILED: {error}"
    found = (f"SASS {', '.join(f'sm_{a}' for a in archs['sass']) or 'none'}, "
             f"PTX {', '.join(f'compute_{a}' for a in archs['ptx']) or 'none'}")
    lacking = sum((KIND_SASS, arch) not in binary for binary in binaries)
    if arch not in archs["sass"]:
        return False, f"{path}: FAILED: no sm_{arch} machine code ({found})"
    if lacking:
        return False, f"{path}: FAILED: {lacking} of {len(binaries)} fat binaries lack sm_{arch} machine code ({found})"
    count = f", {len(binaries)} fat binaries" if len(binaries) > 1 else ""
    return True, f"{path}: sm_{arch} ({found}{count})"


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    failed = 0
    for path in paths:
        ok, line = describe(path)
        print(line)
        failed += not ok
    print(f"{len(paths) - failed} of {len(paths)} have sm_{ARCH} machine code")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
