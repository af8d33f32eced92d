"""core's imports point one way (design.md): every import statement of every module under core/, at
module level or inside a function, is read with ``ast`` (tests/core_imports_support.py) and

- no modules import one another in a circle, and none imports itself;
- no module imports one of a layer above its own (modules of one layer may import one another);
- core never imports Streamlit, ui or views;
- docs/core-imports.dot draws today's graph.

``python tests/test_imports.py`` writes the drawing again.
"""
from __future__ import annotations

import sys

import pytest

import core_imports_support as imports

# design.md: warmup -> lessons -> training -> model -> attention, positional, masks -> validate -> kernels
# -> backend, with the state several layers share at the bottom beside the backend. Bottom first; a
# name ending in ".*" is a package and everything in it.
LAYERS = (
    ("backend and shared state", ("core", "core.allocator", "core.backend", "core.limits", "core.kernel_cache",
                                  "core.recording", "core.readiness")),
    ("kernels", ("core.kernels.*",)),
    ("validate", ("core.validate",)),
    ("attention, positional, masks", ("core.attention", "core.positional", "core.masks")),
    ("model", ("core.model.*",)),
    ("training", ("core.training.*",)),
    ("lessons", ("core.lessons.*",)),
    ("warmup", ("core.warmup",)),
    # A program, not a module: nothing imports it. `python -m core.training --task induction` prints the
    # trained heads' scores, which the lesson measures, so it sits above the lessons.
    ("command line", ("core.training.__main__",)),
)
NEVER = ("streamlit", "ui", "views", "app")      # core is usable from a notebook


def _matches(module: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        package = pattern[:-2]
        return module == package or module.startswith(package + ".")
    return module == pattern


def layer_of(module: str) -> tuple[int, str] | None:
    """``(rank from the bottom, the layer's name)`` of a core module; None when no layer names it.
    The most specific pattern wins (``core`` itself is at the bottom, ``core.kernels.*`` above it)."""
    best = None
    for rank, (name, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if _matches(module, pattern) and (best is None or len(pattern) > best[0]):
                best = (len(pattern), rank, name)
    return None if best is None else best[1:]


@pytest.fixture(scope="module")
def graph():
    return imports.read_graph()


def test_every_import_is_read(graph):
    unknown = [f"{e.where}: {e.target} is no module of core" for e in graph.edges if e.target not in graph.modules]
    unread = [f"{where}: {text} (the module it imports is not written in the source)" for where, text in graph.unresolved]
    assert not unknown + unread, "\n".join(unknown + unread)


def test_every_module_has_a_layer(graph):
    missing = sorted(m for m in graph.modules if layer_of(m) is None)
    assert not missing, f"no layer in tests/test_imports.py's LAYERS names {missing}"


def test_no_module_imports_in_a_circle(graph):
    found = []
    for component in imports.cycles(graph):
        inside = set(component)
        lines = sorted({f"  {e.where}: {e.source} imports {e.target}" for e in graph.edges
                        if e.source in inside and e.target in inside})
        found.append(f"{len(component)} modules import one another in a circle: {', '.join(component)}\n"
                     + "\n".join(lines))
    assert not found, "\n".join(found)


def test_imports_point_down_the_layers(graph):
    upward = set()
    for e in graph.edges:
        source, target = layer_of(e.source), layer_of(e.target)
        if source and target and target[0] > source[0]:
            upward.add(f"{e.where}: {e.source} ({source[1]}) imports {e.target} ({target[1]}), a layer above")
    assert not upward, "\n".join(sorted(upward))


def test_core_never_imports_streamlit_ui_or_views(graph):
    found = [f"{e.where}: {e.source} imports {e.target}" for e in graph.outside if e.target.split(".")[0] in NEVER]
    assert not found, "\n".join(found)


def test_the_drawing_is_todays_graph(graph):
    assert imports.DOT.read_text() == imports.to_dot(graph, layer_of), (
        f"docs/core-imports.dot is not today's import graph: run `{imports.REGENERATE}` and commit it")


if __name__ == "__main__":
    imports.write_dot(layer_of)
    print(f"wrote {imports.DOT}", file=sys.stderr)
