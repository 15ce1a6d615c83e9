"""dev/cuda_kernels.py: the GPU architectures in a binary's .nv_fatbin section, read from hand-built ELF
files, and which GPUs can run what (machine code within a major architecture, PTX at or below it)."""
import pytest

from elf_helpers import elf_with_sections, fat_binary

from dev.cuda_kernels import KIND_PTX, KIND_SASS, architectures, fatbin_entries, runnable_code
from lib.ops import LIBRARY_PATH


def test_architectures_of_every_fat_binary_in_the_section(tmp_path):
    section = fat_binary([(KIND_SASS, 70, b"\x01" * 40), (KIND_SASS, 80, b"\x02" * 24)]) + bytes(8) + \
        fat_binary([(KIND_PTX, 80, b".version 7.0\0"), (KIND_SASS, 80, b"\x03" * 8)])
    assert fatbin_entries(section) == [(KIND_SASS, 70), (KIND_SASS, 80), (KIND_PTX, 80), (KIND_SASS, 80)]
    path = tmp_path / "libcuda_thing.so"
    path.write_bytes(elf_with_sections([(".text", b"\x90" * 16), (".nv_fatbin", section), (".data", bytes(4))]))
    assert architectures(str(path)) == {"sass": [70, 80], "ptx": [80]}


def test_a_binary_without_device_code_and_a_file_that_is_not_elf(tmp_path):
    assert architectures(LIBRARY_PATH) == {"sass": [], "ptx": []}
    bogus = tmp_path / "not_elf.so"
    bogus.write_bytes(b"MZ" + bytes(100))
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        architectures(str(bogus))


CU117 = {"sass": [50, 60, 70, 80, 86], "ptx": []}  # mxnet-cu117 1.9.1's libmxnet.so (docs/gpu.md)


@pytest.mark.parametrize("archs, compute_capability, expected", [
    (CU117, 70, "sass"), (CU117, 75, "sass"), (CU117, 86, "sass"),
    (CU117, 89, "sass"),  # sm_86 code runs on sm_89 (same major, higher minor)
    (CU117, 90, "none"), (CU117, 100, "none"),  # no sm_9x/sm_10x code, no PTX: nothing runs
    ({"sass": [86], "ptx": [86]}, 90, "ptx-jit"),
    ({"sass": [], "ptx": [90]}, 86, "none"),  # PTX of a newer architecture cannot be compiled for an older one
    ({"sass": [86], "ptx": []}, 80, "none"),  # machine code of a higher minor does not run on a lower one
])
def test_which_code_a_gpu_runs(archs, compute_capability, expected):
    assert runnable_code(archs, compute_capability) == expected
