"""How the parity harness reports: agreement as a percentage with its counts, tables in Markdown."""
from lib.benchmarking import markdown_table


def percent(hits, total):
    return f"{100.0 * hits / total:.1f}% ({hits} / {total})" if total else "-"


def format_table(title, header, rows):
    """A Markdown table under ``### title``."""
    return f"### {title}\n\n{markdown_table(header, rows)}\n"
