"""Pages and their helpers use core's public names only: no module of views/ or ui/ imports a name
starting with ``_`` from core (``from core.x import _y``), nor reads one off a core module
(``core_module._y``, ``import core.x as m; m._y``). Dunder names (``tr.__file__``) are public.

Every module is read with ``ast``: the names each binds to core modules (``import core.x as m``,
``from core import x``, ``from core.model import layers as L``), then every attribute read off
those names.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*(ROOT / "views").glob("*.py"), *(ROOT / "ui").glob("*.py")])


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_core(module: str | None) -> bool:
    return module is not None and (module == "core" or module.startswith("core."))


def private_core_names(source: str) -> list[str]:
    """Each private name of core that ``source`` imports or reads, as ``line: what``."""
    tree = ast.parse(source)
    modules = set()                     # the names bound to core modules (or to names read off them)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if is_core(alias.name):
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and is_core(node.module) and node.level == 0:
            for alias in node.names:
                if private(alias.name):
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):     # core.model.layers._x reads through packages
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_the_reader_finds_each_way_of_reaching_a_private_name():
    source = ("from core.model.tuned import forward as TF\nimport core.model.layers\nimport core.attention as A\n"
              "from core.x import _hidden, shown\nfrom ui import charts\n"
              "a = TF._softmax_rows\nb = core.model.layers._gelu\nc = A.split_heads\nd = A._leading(1)\n"
              "e = TF.__file__\nf = charts._private\ng = shown._inner\n")
    assert private_core_names(source) == ["4: from core.x import _hidden", "6: TF._softmax_rows",
                                          "7: core.model.layers._gelu", "9: A._leading", "12: shown._inner"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_or_helper_reaches_into_core_for_a_private_name(path):
    found = private_core_names(path.read_text(encoding="utf-8"))
    assert not found, f"{path.relative_to(ROOT)} uses core's private names:\n" + "\n".join(found)
