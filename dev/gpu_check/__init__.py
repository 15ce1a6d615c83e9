"""The GPU check behind tools/gpu_check.py (docs/gpu.md): ``runs`` is what each child process does,
``report`` runs them, judges their results and writes the report."""
