"""What a clone carries besides the code: the licence (Apache-2.0, as the reference's and MXNet's) and the
citation block README gives for the papers the project reimplements."""
import os
import re

from lib.bootstrap import ROOT


def read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def test_the_licence_is_the_full_apache_2_text():
    text = read("LICENSE")
    assert text.lstrip().startswith("Apache License\n") and "Version 2.0, January 2004" in text
    sections = re.findall(r"^\s+(\d)\. (\w+)", text, re.MULTILINE)
    assert [int(number) for number, _ in sections] == list(range(1, 10))  # Definitions .. Accepting Warranty
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text


def bibtex_entries(readme):
    """``{key: {field: value}}`` of the ```bibtex blocks of README (one level of braces inside values)."""
    entries = {}
    for block in re.findall(r"```bibtex\n(.*?)```", readme, re.DOTALL):
        for kind, key, body in re.findall(r"@(\w+)\{([\w:-]+),\n(.*?)\n\}", block, re.DOTALL):
            fields = dict(re.findall(r"(\w+)\s*=\s*\{((?:[^{}]|\{[^{}]*\})*)\}", body))
            entries[key] = dict(fields, kind=kind)
    return entries


def test_readme_cites_sniper_and_autofocus_in_bibtex():
    readme = read("README.md")
    entries = bibtex_entries(readme)
    assert [(e["kind"], e["title"], e["year"]) for e in entries.values()] == [
        ("inproceedings", "{SNIPER}: Efficient Multi-Scale Training", "2018"),
        ("inproceedings", "{AutoFocus}: Efficient Multi-Scale Inference", "2019")]
    sniper, autofocus = entries.values()
    assert "NeurIPS" in sniper["booktitle"] and "ICCV" in autofocus["booktitle"]
    assert sniper["author"] == "Singh, Bharat and Najibi, Mahyar and Davis, Larry S."
    assert autofocus["author"] == "Najibi, Mahyar and Singh, Bharat and Davis, Larry S."
    assert "[LICENSE](LICENSE)" in readme and "Apache License 2.0" in readme
