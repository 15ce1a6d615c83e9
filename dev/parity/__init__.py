"""A parity harness: the reference's own code, run from a checkout of it, against the project's.

Nothing of the reference is in the repository: ``dev.parity.shim`` converts its Python 2 modules at run
time (lib2to3, stub modules for what a comparison does not need) and ``dev.parity.reference`` compiles
its C++ with a wrapper of ours into a temporary folder. ``dev.parity.compare`` draws random inputs,
runs both sides and prints the tables of docs/reference_differences.md (``dev/parity_compare.py``).
"""
