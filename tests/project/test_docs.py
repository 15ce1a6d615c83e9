"""The docs stay true: links and anchors resolve, README stays a landing page, and every command a ```bash block
gives for a repository script or make target names one that exists, with flags its argparse accepts.

Flags are read from the scripts' sources (``add_argument`` calls, and those of the project's ``add_*argument(s)``
helpers a script calls), so the check costs no interpreter start per script; one test holds that reading equal to
a script's own ``--help``."""
import ast
import os
import re
import shlex
import subprocess
import sys
import unicodedata

import pytest

from lib.bootstrap import ROOT

DOCS = ["README.md", "BENCHMARKS.md", "ARCHITECTURE.md"] + sorted(
    os.path.join("docs", name) for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))
README_MAX_LINES = 220
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A section named in code or a message: `docs/x.md#anchor`, or `README, "Section"` / `BENCHMARKS.md, "Section"`.
CODE_ANCHOR = re.compile(r"\b((?:docs/)?[A-Za-z_]+\.md)#([\w-]+)")
CODE_SECTION = re.compile(r"\b((?:docs/)?[A-Za-z_]+\.md|README)[,:] ['\"]([^'\"]+)['\"]")
INTERPRETERS = ("python", "python3", ".venv/bin/python")


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def outside_code(text):
    """The lines of a Markdown text outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading):
    """GitHub's anchor of a heading: its text without Markdown marks, lower case, punctuation but ``-`` and ``_``
    dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor GitHub gives the headings of ``path`` (a repeated heading gets ``-1``, ``-2``, ...)."""
    seen, found = {}, set()
    for line in outside_code(read(path)):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            found.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return found


def test_the_slug_follows_githubs_rules():
    assert slug("Main job (`make train`)") == "main-job-make-train"
    assert slug("Deploy: ONNX and ONNX Runtime, without MXNet") == "deploy-onnx-and-onnx-runtime-without-mxnet"
    assert slug("A reference YAML's keys in the project") == "a-reference-yamls-keys-in-the-project"
    assert slug("Large images: whole-image vs tiled (`tools/benchmark_large_images.py`)") == \
        "large-images-whole-image-vs-tiled-toolsbenchmark_large_imagespy"


def links(path):
    """``(target, text)`` of the Markdown links of ``path`` outside code blocks and inline code (a link's text may
    run over a line break)."""
    text = re.sub(r"`[^`\n]*`", "", "\n".join(outside_code(read(path))))
    return [(match.group(1), match.group(0)) for match in LINK.finditer(text)]


@pytest.mark.parametrize("path", DOCS)
def test_every_relative_link_and_anchor_resolves(path):
    broken = []
    for target, _ in links(path):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(os.path.join(ROOT, linked)):
            broken.append(f"{target}: no file {linked}")
        elif anchor and (not linked.endswith(".md") or anchor not in anchors(linked)):
            broken.append(f"{target}: no heading #{anchor} in {linked}")
    assert not broken, f"{path}: " + "; ".join(broken)


def test_every_doc_is_linked_from_readme_or_another_doc():
    linked = {os.path.normpath(os.path.join(os.path.dirname(path), target.partition("#")[0]))
              for path in DOCS for target, _ in links(path) if not re.match(r"^[a-z]+:", target)}
    assert [path for path in DOCS if path != "README.md" and path not in linked] == []


def test_readme_is_a_short_landing_page_with_a_contents_list():
    readme = read("README.md")
    assert len(readme.splitlines()) <= README_MAX_LINES
    contents = readme.split("## Contents", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\(#([\w-]+)\)", contents)
    sections = {slug(line[3:]) for line in outside_code(readme) if line.startswith("## ")}
    assert set(listed) == sections - {"contents"}, "the contents list and README's sections differ"


def code_files():
    for folder in ("lib", "dev", "tools", "symbols", "chip_generator", "configs", "scripts", "tests"):
        for parent, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
            for name in files:
                if name.endswith((".py", ".sh", ".yml", ".pyx", ".html")):
                    yield os.path.join(parent, name)
    yield from (os.path.join(ROOT, name) for name in ("Makefile", "main_train.py", "main_test.py", "demo.py"))


def test_the_sections_that_code_and_messages_name_exist():
    """A docstring or message that sends the reader to a section (``docs/training.md#resuming``, ``README,
    "How many epochs"``) names one that is there."""
    titles = {path: {slug(line.lstrip("#").strip()) for line in outside_code(read(path)) if line.startswith("#")}
              for path in DOCS}
    missing = []
    for path in code_files():
        if os.path.basename(path) == "test_docs.py":
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for doc, anchor in CODE_ANCHOR.findall(text):
            if doc not in titles or anchor not in anchors(doc):
                missing.append(f"{os.path.relpath(path, ROOT)}: {doc}#{anchor}")
        for doc, section in CODE_SECTION.findall(text):
            doc = "README.md" if doc == "README" else doc
            if doc not in titles or not any(t.startswith(slug(section)) for t in titles[doc]):
                missing.append(f"{os.path.relpath(path, ROOT)}: {doc}, {section!r}")
    assert missing == [], "\n".join(missing)


# ---- commands of the ```bash blocks ----

def bash_commands(path):
    """``(command words)`` of every command in the ```bash blocks of ``path``: continuation lines joined,
    comments dropped, split at ``&&``, ``||``, ``;`` and ``|``."""
    commands, block, fenced = [], [], None
    for line in read(path).splitlines():
        stripped = line.strip()
        if fenced is None and stripped.startswith("```"):
            fenced = stripped[3:].strip()
            block = []
        elif fenced is not None and stripped.startswith("```"):
            if fenced in ("bash", "sh", "shell"):
                commands.extend(split_commands("\n".join(block)))
            fenced = None
        elif fenced is not None:
            block.append(line)
    return commands


def without_comment(line):
    """``line`` up to a ``#`` that starts a shell comment (outside quotes, after a blank)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def split_commands(script):
    joined = re.sub(r"\\\n", " ", "\n".join(without_comment(line) for line in script.splitlines()))
    lexer = shlex.shlex(joined, posix=True, punctuation_chars=";&|\n")
    lexer.whitespace, lexer.whitespace_split, lexer.commenters = " \t\r", True, ""
    try:
        lexed = list(lexer)
    except ValueError as error:
        raise ValueError(f"{error}: {joined}") from None
    found, words = [], []
    for word in lexed:
        if word and set(word) <= set(";&|\n"):  # a separator (a quoted "" is a word)
            found.append(words)
            words = []
        else:
            words.append(word)
    return [words for words in found + [words] if words]


def program_of(words):
    """``("python", script, args)``, ``("make", None, args)``, ``("file", path, args)`` or None for a command that
    runs no repository program (cp, curl, git ...)."""
    words = list(words)
    while words and (re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]) or words[0] in ("/usr/bin/time", "-v", "nice",
                                                                                 "exec")):
        words.pop(0)
    if not words:
        return None
    if words[0] in INTERPRETERS:
        if len(words) < 2 or words[1] in ("-c", "-m"):
            return None
        return "python", words[1], words[2:]
    if words[0] == "make":
        return "make", None, words[1:]
    if words[0].startswith(("scripts/", "tools/", "dev/", "./")):
        return "file", words[0], words[1:]
    return None


def project_helpers():
    """``{function name: its AST}`` of the project's ``add_*argument(s)`` helpers."""
    helpers = {}
    for folder in ("lib", "dev", "tools"):
        for parent, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    tree = ast.parse(read(os.path.join(parent, name)))
                    for node in ast.walk(tree):
                        if isinstance(node, ast.FunctionDef) and re.match(r"add_\w*arguments?$", node.name):
                            helpers[node.name] = node
    return helpers


HELPERS = project_helpers()


def options_in(tree, seen=()):
    """The option strings of the ``add_argument`` calls in ``tree`` and in the helpers it calls."""
    options = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            called = getattr(node.func, "attr", getattr(node.func, "id", None))
            if called == "add_argument":
                options |= {arg.value for arg in node.args
                            if isinstance(arg, ast.Constant) and str(arg.value).startswith("-")}
            elif called in HELPERS and called not in seen:
                options |= options_in(HELPERS[called], (*seen, called))
    return options


def script_options(script):
    """The option strings ``script``'s argparse accepts, read from its source."""
    return options_in(ast.parse(read(script))) | {"-h", "--help"}


def make_targets():
    """The Makefile's targets (a rule may name several: ``mxnet-gpu mxnet-gpu-smoke:``)."""
    rules = re.findall(r"^([a-z][\w. -]*):(?!=)", read("Makefile"), re.MULTILINE)
    return {target for rule in rules for target in rule.split()}


WRAPPERS = {"scripts/train_neg_props_and_sniper.sh": "tools/train_neg_chips.py"}  # runs that script with "$@"


def command_problems(words):
    program = program_of(words)
    if program is None:
        return []
    kind, path, args = program
    if kind == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a]
        return [f"make: no target {t}" for t in targets if t not in make_targets()]
    if not os.path.isfile(os.path.join(ROOT, path)):
        return [f"no file {path}"]
    script = WRAPPERS.get(path, path)
    if not script.endswith(".py"):
        return []
    inner = []
    if "--" in args:  # a launcher's command: the words after -- are a command of their own
        args, inner = args[:args.index("--")], args[args.index("--") + 1:]
    accepted = script_options(script)
    used = {a.split("=", 1)[0] for a in args if a.startswith("-") and not re.match(r"^-\d", a)}
    return [f"{script}: no option {option}" for option in sorted(used - accepted)] + command_problems(inner)


@pytest.mark.parametrize("path", DOCS)
def test_every_command_names_an_existing_script_and_its_options(path):
    problems = [f"{' '.join(words)}: {problem}" for words in bash_commands(path)
                for problem in command_problems(words)]
    assert problems == [], f"{path}:\n" + "\n".join(problems)


def test_the_docs_run_the_programs_they_should():
    """The check is not vacuous: the docs' commands reach the entry points, tools and make targets."""
    programs = {(program_of(words) or (None, None, None))[:2] for path in DOCS for words in bash_commands(path)}
    assert {("python", "main_train.py"), ("python", "main_test.py"), ("python", "demo.py"),
            ("python", "tools/export_model.py"), ("make", None)} <= programs


def test_the_command_check_finds_bad_commands():
    assert command_problems(["python", "main_test.py", "--model", "x", "--no-such-flag"]) == \
        ["main_test.py: no option --no-such-flag"]
    assert command_problems(["make", "no-such-target"]) == ["make: no target no-such-target"]
    assert command_problems(["python", "tools/no_such_tool.py"]) == ["no file tools/no_such_tool.py"]
    assert command_problems(["OMP_NUM_THREADS=2", "python", "tools/fit_scales.py", "--cfg", "c.yml",
                             "--keep=0.9"]) == []
    assert split_commands("rm -rf .venv && make MXNET=mxnet-cu117  # a comment\nls | make test") == [
        ["rm", "-rf", ".venv"], ["make", "MXNET=mxnet-cu117"], ["ls"], ["make", "test"]]
    assert split_commands('python main_test.py --set gpus "" \\\n    TEST.fp16 false') == [
        ["python", "main_test.py", "--set", "gpus", "", "TEST.fp16", "false"]]


def test_options_read_from_the_source_equal_the_scripts_help():
    """The source reading agrees with argparse itself, on an entry point that answers --help quickly."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "main_test.py"), "--help"], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    shown = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", result.stdout.split("options:", 1)[-1]))
    assert script_options("main_test.py") == shown


# ---- names the docs give ----

PATH_WORD = re.compile(r"`((?:lib|dev|tools|symbols|chip_generator|configs|scripts|tests|docs)/[\w./-]*)`")


OWN_DOCS = [path for path in DOCS if path != "docs/reference_differences.md"]  # which also names the reference's


@pytest.mark.parametrize("path", OWN_DOCS)
def test_the_repository_files_the_docs_name_exist(path):
    """A path in inline code (`lib/inference/masks.py`, `tools/mxnet_gpu/`) is one of the checkout's; words with
    placeholders (`tools/NAME.py`, `{out}/...`) or a glob are not paths."""
    named = {word for line in outside_code(read(path)) for word in PATH_WORD.findall(line)
             if not re.search(r"[A-Z]{2,}|[{}*]", word.split("/", 1)[1])}
    assert sorted(word for word in named if not os.path.exists(os.path.join(ROOT, word))) == []


CONFIG_WORD = re.compile(r"`((?:TRAIN|TEST|dataset|network|default)\.[A-Za-z_][\w.]*)`")


@pytest.mark.parametrize("path", OWN_DOCS)
def test_the_config_keys_the_docs_name_exist(path):
    """Every `SECTION.KEY` in inline code is a key of configs/default.py (or a renamed one, which the loader names
    the new name of)."""
    from configs.default import DEFAULTS
    from lib.config.core import DERIVED_KEYS, RENAMED_KEYS, flat_config

    known = set(flat_config(DEFAULTS)) | set(RENAMED_KEYS) | set(DERIVED_KEYS)
    named = {word for line in outside_code(read(path)) for word in CONFIG_WORD.findall(line)}
    assert sorted(named - known) == []


def config_arguments(args):
    """``(cfg file, --set words)`` of a command's arguments, or None without ``--cfg``."""
    if "--cfg" not in args:
        return None
    cfg, words, taking = args[args.index("--cfg") + 1], [], False
    for word in args:
        if word.startswith("--"):
            taking = word == "--set"
        elif taking:
            words.append(word)
    return cfg, words


def documented_configs():
    """``(doc, command, cfg, --set words)`` of every documented command that names a shipped config; commands
    with placeholders (`E`, `S`, `FILE`, `path/to/...`) or a config the reader writes first are left out."""
    for path in DOCS:
        for words in bash_commands(path):
            program = program_of(words)
            found = program and program[0] in ("python", "file") and config_arguments(program[2])
            if found and os.path.isfile(os.path.join(ROOT, found[0])) and not any(
                    re.fullmatch(r"[A-Z]+|path/to/.*|\$\w+", word) for word in found[1]):
                yield path, " ".join(words), found[0], found[1]


def test_every_documented_config_and_override_loads():
    """The configs and ``--set`` overrides the docs give load and validate (keys, types, cross-key checks)."""
    from lib.config import load_config
    from lib.config.core import parse_cli_overrides

    checked, failed = 0, []
    for path, command, cfg, words in documented_configs():
        try:
            load_config(os.path.join(ROOT, cfg), parse_cli_overrides(words))
            checked += 1
        except Exception as error:  # noqa: BLE001 - every failure is reported with its command
            failed.append(f"{path}: {command}: {error}")
    assert failed == [] and checked >= 20, "\n".join(failed) or checked


# ---- rendering ----

def table_cells(line):
    """The cells of a Markdown table row: split at ``|`` outside inline code."""
    cells, cell, code = [], "", False
    for c in line.strip().strip("|"):
        if c == "`":
            code = not code
        if c == "|" and not code:
            cells.append(cell)
            cell = ""
        else:
            cell += c
    return cells + [cell]


@pytest.mark.parametrize("path", DOCS)
def test_tables_and_code_fences_render(path):
    """Code fences are closed, and every row of a table has its header's number of cells (GitHub drops the cells
    of a longer row and pads a shorter one: a pipe in a cell's text shifts the columns)."""
    text = read(path)
    assert len(re.findall(r"^\s*```", text, re.MULTILINE)) % 2 == 0, "a code fence is not closed"
    uneven, table = [], []
    for line in outside_code(text) + [""]:
        if line.startswith("|"):
            table.append(line)
            continue
        if len(table) >= 2:
            width = len(table_cells(table[0]))
            uneven += [row[:80] for row in table[1:] if len(table_cells(row)) != width]
        table = []
    assert uneven == []


def test_table_cells_ignore_pipes_in_inline_code():
    assert [c.strip() for c in table_cells("| a | `x | y` | b |")] == ["a", "`x | y`", "b"]
    assert len(table_cells("| a | b | c |")) == 3


def test_every_tool_has_its_line_in_tools_md():
    """docs/tools.md names every program under tools/ (scripts and script folders) and dev/'s scripts."""
    page = read("docs/tools.md")
    tools = [name for name in os.listdir(os.path.join(ROOT, "tools")) if not name.startswith(("_", "."))
             and (name.endswith((".py", ".sh")) or os.path.isdir(os.path.join(ROOT, "tools", name)))]
    dev = [f"dev/{name}" for name in os.listdir(os.path.join(ROOT, "dev"))
           if name.endswith(".py") and not name.startswith("_") and "__main__" in read(f"dev/{name}")]
    assert len(tools) > 30 and dev
    missing = [name for name in tools if f"`{name}" not in page and f"`{name}/`" not in page]
    assert missing + [script for script in dev if f"`{script}" not in page] == []


def test_architecture_lists_the_layers_the_layer_test_enforces():
    """ARCHITECTURE.md's "Imports point down" block is LAYERS of the import-layer test (read from its source,
    wherever the tests' folders put it), one line per layer from the top, package roots aside."""
    source = next(os.path.join(parent, "test_layers.py") for parent, _, files in os.walk(os.path.join(ROOT, "tests"))
                  if "test_layers.py" in files)
    with open(source, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    layers = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                  and getattr(node.targets[0], "id", None) == "LAYERS")
    section = read("ARCHITECTURE.md").split("## Imports point down", 1)[1]
    block = section.split("```", 2)[1].strip().splitlines()
    documented = [{unit.strip().replace("/", ".") for unit in line.split(":")[-1].split(",") if unit.strip()}
                  for line in block]
    assert documented[1:] == [set(layer) - {"lib", "dev"} for layer in layers[1:]]


@pytest.mark.parametrize("path", ["docs/configuration.md", "docs/inference.md"])
def test_the_key_tables_give_the_defaults_of_configs_default(path):
    """A key-table row of one key gives its default as configs/default.py has it (the first value of the cell,
    before a remark in parentheses)."""
    import yaml
    from configs.default import DEFAULTS
    from lib.config.core import flat_config

    defaults, wrong, rows = flat_config(DEFAULTS), [], 0
    for line in outside_code(read(path)):
        cells = table_cells(line) if line.startswith("| `") else []
        keys = re.findall(r"`([^`]+)`", cells[0]) if cells else []
        if len(keys) == 1 and keys[0] in defaults:
            rows += 1
            text = re.split(r" \(|; ", cells[1].strip())[0].strip("`'")
            value, default = yaml.safe_load(text) if text else "", defaults[keys[0]]
            if value != (list(default) if isinstance(default, tuple) else default) and str(value) != str(default):
                wrong.append(f"{keys[0]}: {cells[1].strip()} (configs/default.py: {default!r})")
    assert rows >= 5 and wrong == [], wrong
