"""What checks the project rather than makes it (Detectron2 keeps the same apart in dev/): the parity harness
against the reference's own code (parity/, parity_compare.py, parity_proposal_target.py), the comparison of two
commits (commit_comparison.py, compare_commits.py), the NumPy oracles the compiled operators are tested against
(oracles/), and the GPU check's internals (gpu_check/, cuda_kernels.py; tools/gpu_check.py is its front).
Nothing in lib/, symbols/ or chip_generator/ imports it."""
