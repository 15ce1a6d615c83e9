"""How the parity harness reports: tables in Markdown under a title (agreement counts: lib.benchmarking.percent)."""
from lib.benchmarking import markdown_table


def format_table(title, header, rows):
    """A Markdown table under ``### title``."""
    return f"### {title}\n\n{markdown_table(header, rows)}\n"

