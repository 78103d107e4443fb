"""The docs keep up with the code: every module is in docs/ARCHITECTURE.md's
tables, with the first paragraph of its docstring."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sluicegate"
LAYERS = ["core", "engines", "server", "client", "check"]


@pytest.mark.parametrize("layer", LAYERS)
def test_every_module_of_a_layer_is_in_the_architecture_tables(layer: str) -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    missing = []
    for module in sorted((PACKAGE / layer).glob("*.py")):
        if module.name == "__init__.py":
            continue
        docstring = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8")))
        assert docstring, f"{layer}/{module.name} has no module docstring"
        summary = " ".join(docstring.split("\n\n")[0].split()).replace("``", "`")
        if f"| `{module.name}` | {summary} |" not in doc:
            missing.append(f"| `{module.name}` | {summary} |")
    assert not missing, "docs/ARCHITECTURE.md lacks or misquotes:\n" + "\n".join(
        missing
    )
