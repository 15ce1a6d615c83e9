"""How the parity harness reports: agreement as a percentage with its counts, tables in Markdown."""
import os

from lib.benchmarking import markdown_table


def percent(hits, total):
    return f"{100.0 * hits / total:.1f}% ({hits} / {total})" if total else "-"


def format_table(title, header, rows):
    """A Markdown table under ``### title``."""
    return f"### {title}\n\n{markdown_table(header, rows)}\n"


def thread_count():
    """The CPU operators' thread count in words: compiled kernels and BLAS split their sums by it, so the last
    bits of their results (and the figures measured on them) may depend on it."""
    threads = os.environ.get("OMP_NUM_THREADS")
    cores = os.cpu_count()
    return f"OMP_NUM_THREADS {threads}" if threads else f"OMP_NUM_THREADS unset (MXNet's default on {cores} cores)"
