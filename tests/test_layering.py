"""Lower layers never import higher ones: kernels, layers, models and loaders know nothing of the worker, the
engine or the entry points, so each can be reused and tested alone."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "brisk"
LOWER = ["layers", "models", "loader", "distributed", "forward_context.py", "device_transfer.py"]
HIGHER = ("brisk.worker", "brisk.engine", "brisk.entrypoints", "brisk.bench", "brisk.llm")


def imported_modules(path: pathlib.Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("lower", LOWER)
def test_lower_layers_import_no_higher_one(lower):
    root = PACKAGE / lower
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    assert files
    offenders = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in files
        for name in imported_modules(path)
        if name.startswith(HIGHER)
    ]
    assert not offenders, offenders
