"""The docs keep up with the code: every module is in docs/ARCHITECTURE.md's
tables, with the first paragraph of its docstring, and every module, class and
function the architecture and design pages name exists; the docs' relative
links resolve, and the ``sluicegate`` commands they show exist with the options
they show."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from sluicegate.cli import _parser

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sluicegate"
# Every package below sluicegate: a layer (``core``) or one of its subpackages
# (``core/decoding``), each with its own table.
LAYERS = sorted(
    path.parent.relative_to(PACKAGE).as_posix()
    for path in PACKAGE.glob("**/__init__.py")
    if path.parent != PACKAGE
)


# A bold heading naming a folder, an optional paragraph, then its table.
TABLE = r"\*\*(.+?)\*\*\n\n(?:[^|\n].*\n\n)?((?:\|.*\n)+)"


@pytest.mark.parametrize("layer", LAYERS)
def test_every_module_of_a_layer_is_in_the_architecture_tables(layer: str) -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    tables = doc.split("## Where each piece lives", 1)[1]
    table = dict(re.findall(TABLE, tables)).get(f"{layer}/", "")
    missing = []
    for module in sorted((PACKAGE / layer).glob("*.py")):
        if module.name == "__init__.py":
            continue
        docstring = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8")))
        assert docstring, f"{layer}/{module.name} has no module docstring"
        summary = " ".join(docstring.split("\n\n")[0].split()).replace("``", "`")
        if f"| `{module.name}` | {summary} |" not in table:
            missing.append(f"| `{module.name}` | {summary} |")
    assert not missing, "docs/ARCHITECTURE.md lacks or misquotes:\n" + "\n".join(
        missing
    )


DOCS = [
    ROOT / "README.md",
    ROOT / "CONTRIBUTING.md",
    *sorted((ROOT / "docs").glob("*.md")),
]

# Names the architecture page uses that are not sluicegate's own: the ASGI
# callables, asyncio's ``Task.uncancel`` and a company name.
FOREIGN_NAMES = frozenset({"OpenAI", "receive", "send", "uncancel"})


def test_every_module_path_named_in_the_architecture_exists() -> None:
    """A path such as ``server/streaming/pump.py`` is under the package, the
    server package (``streaming/pump.py``) or the repo; a bare name such as
    ``pump.py`` is a module somewhere in the package; a row of a layer's
    table names a module of that layer."""
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = []
    for name in sorted(set(re.findall(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b", doc))):
        if "/" in name:
            found = any(
                (folder / name).exists()
                for folder in (ROOT, PACKAGE, PACKAGE / "server")
            )
        else:
            found = any(PACKAGE.rglob(name))
        if not found:
            missing.append(name)
    tables = doc.split("## Where each piece lives", 1)[1]
    for heading, rows in re.findall(TABLE, tables):
        folder = PACKAGE if heading == "top level" else PACKAGE / heading.rstrip("/")
        for name in re.findall(r"^\| `([\w.]+\.py)` \|", rows, re.M):
            if not (folder / name).exists():
                missing.append(f"{heading}: {name}")
    assert not missing, (
        f"docs/ARCHITECTURE.md names modules that do not exist: {missing}"
    )


def test_every_class_and_function_the_design_docs_name_exists() -> None:
    """CamelCase names and ``name()`` calls in docs/ARCHITECTURE.md and
    docs/DESIGN.md are defined somewhere in the package."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    defined = set(re.findall(r"^\s*(?:class|(?:async )?def) (\w+)", source, re.M))
    defined |= set(re.findall(r"^(\w+)\s*[:=]", source, re.M))
    unknown = set()
    for page in ("ARCHITECTURE.md", "DESIGN.md"):
        doc = (ROOT / "docs" / page).read_text(encoding="utf-8")
        names = set(re.findall(r"\b([a-z_][a-z0-9_]*)\(", doc))
        for span in re.findall(r"`([^`\n]+)`", doc):
            camel = re.fullmatch(r"([A-Z][a-z]\w*[A-Z]\w*)(?:\.\w+)?(?:\(\))?", span)
            if camel:
                names.add(camel.group(1))
        for block in re.findall(r"```\n(.*?)```", doc, re.S):
            names |= set(re.findall(r"\b([A-Z][a-z]+(?:[A-Z][a-z0-9]*)+)\b", block))
        unknown |= {f"{page}: {n}" for n in names - defined - FOREIGN_NAMES}
    assert not unknown, f"names no module defines: {sorted(unknown)}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "mailto:", "#")):
            continue
        if not (page.parent / target.split("#", 1)[0]).exists():
            broken.append(target)
    assert not broken, f"{page.name} links to missing files: {broken}"


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.name)
def test_every_sluicegate_command_in_the_docs_exists(page: Path) -> None:
    """``sluicegate SUBCOMMAND --option ...`` in a code span or an ``sh`` block
    names a real subcommand and options it has."""
    subcommands = next(
        a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    text = page.read_text(encoding="utf-8")
    lines = re.findall(r"`([^`\n]+)`", text)
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        lines += block.replace("\\\n", " ").splitlines()
    wrong = []
    for line in lines:
        for match in re.finditer(
            r"(?:^|[\s/])sluicegate ([a-z]+)(?=\s|$)([^#|]*)", line
        ):
            command, rest = match.groups()
            if command not in subcommands:
                wrong.append(line)
                continue
            options = subcommands[command]._option_string_actions
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                if option not in options:
                    wrong.append(f"{line} ({option})")
    assert not wrong, f"{page.name}: commands the CLI does not have: {wrong}"
