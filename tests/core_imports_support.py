"""The import graph of ``core/``, read from the source with ``ast``: every import statement of every
module, at module level and inside functions, resolved to the module it loads.

Resolved: ``import a.b``, ``from a import b`` (``b`` a submodule or a name in ``a``), relative
imports (``from . import b``), ``importlib.import_module("a.b")`` and ``__import__("a.b")`` with a
literal name, ``importlib.import_module(f"{__name__}.{x}")`` (any submodule of the package),
``importlib.import_module(name)`` with ``name`` a variable (every core module the file names in a
string: the names have to come from somewhere), and
core's public short names (``from core import encoder``: the lazy ``_PUBLIC_MODULES`` map in
``core/__init__.py``), which count as an import of the module the name stands for, made by the
module that asks for it. An import whose module the source does not name is listed apart
(:attr:`Graph.unresolved`), so that no import escapes a check.

    graph = read_graph()
    graph.edges            # [Import(source="core.attention", target="core.kernels.dispatch", path=..., line=19), ...]
    write_dot(layer_of)    # docs/core-imports.dot, layer_of(module) -> (rank, layer's name)
"""
from __future__ import annotations

import ast
import dataclasses
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
DOT = ROOT / "docs" / "core-imports.dot"
REGENERATE = "python tests/test_imports.py"


@dataclasses.dataclass(frozen=True)
class Import:
    """``source`` (a core module) imports ``target`` (a dotted module name, core's or another
    package's) at ``path:line``."""

    source: str
    target: str
    path: str           # relative to the repository's root
    line: int

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclasses.dataclass
class Graph:
    modules: dict                  # dotted name -> file (Path) of every module under core/
    edges: list                    # Import, target a core module
    outside: list                  # Import, target outside core (numpy, streamlit, ui ...)
    unresolved: list               # (where, source text) of imports whose module cannot be read off the source
    public: dict                   # core's public short name -> the module it stands for


def module_files(root: Path = CORE) -> dict[str, Path]:
    """Every module under ``root``, by dotted name (a package by its own name: ``core.model``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def public_names(init: Path = CORE / "__init__.py") -> dict[str, str]:
    """The literal ``_PUBLIC_MODULES`` map of ``core/__init__.py``: short name -> module."""
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_PUBLIC_MODULES"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def _literal(node) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_import_call(call: ast.Call) -> bool:
    f = call.func
    return ((isinstance(f, ast.Attribute) and f.attr == "import_module")
            or (isinstance(f, ast.Name) and f.id in ("import_module", "__import__")))


class _Reader:
    """The imports of one module."""

    def __init__(self, name: str, path: Path, root: Path, source: str, modules: dict, public: dict):
        self.name, self.source, self.modules, self.public = name, source, modules, public
        self.package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self.path = str(path.relative_to(root.parent))
        self.found: list[Import] = []
        self.unresolved: list[tuple[str, str]] = []

    def add(self, target: str, node) -> None:
        self.found.append(Import(self.name, target, self.path, node.lineno))

    def absolute(self, module: str | None, level: int) -> str:
        """The dotted name a (possibly relative) ``from`` clause names."""
        if not level:
            return module or ""
        base = self.package.split(".")
        base = base[:len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def module_or_name(self, package: str, name: str) -> str:
        """What ``from package import name`` loads: the submodule ``package.name`` when there is one,
        the module a public short name stands for, else ``package`` itself."""
        if f"{package}.{name}" in self.modules:
            return f"{package}.{name}"
        if package == "core" and name in self.public:
            return self.public[name]
        return package

    def read(self, tree) -> None:
        self.literals = sorted({n.value for n in ast.walk(tree) if _literal(n) is not None})
        imports_core = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.add(alias.name, node)
                    imports_core |= alias.name == "core" and alias.asname is None
            elif isinstance(node, ast.ImportFrom):
                package = self.absolute(node.module, node.level)
                for alias in node.names:
                    self.add(package if alias.name == "*" else self.module_or_name(package, alias.name), node)
            elif isinstance(node, ast.Call) and _is_import_call(node):
                self.call(node)
        if imports_core:                                   # import core; core.encoder: a public short name
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "core"
                        and node.attr in self.public):
                    self.add(self.public[node.attr], node)

    def call(self, node: ast.Call) -> None:
        arg = node.args[0] if node.args else None
        text = ast.get_source_segment(self.source, node) or ast.dump(node)
        if (name := _literal(arg)) is not None:
            package = _literal(node.args[1]) if len(node.args) > 1 else None
            if name.startswith(".") and package:
                level = len(name) - len(name.lstrip("."))
                base = package.split(".")
                name = ".".join(base[:len(base) - (level - 1)] + [name.lstrip(".")])
            self.add(name, node)
        elif (isinstance(arg, ast.JoinedStr) and len(arg.values) >= 2
              and isinstance(arg.values[0], ast.FormattedValue) and isinstance(arg.values[0].value, ast.Name)
              and arg.values[0].value.id == "__name__" and _literal(arg.values[1]) == "."):
            # f"{__name__}.{x}": one of this package's own submodules
            for other in self.modules:
                if other.rpartition(".")[0] == self.name:
                    self.add(other, node)
        elif (self.name == "core" and isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name)
              and arg.value.id == "_PUBLIC_MODULES"):
            pass                # the public short names: an import of whoever asks (module_or_name)
        elif named := [m for m in self.literals if m in self.modules]:
            # import_module(name) with name a variable: whichever core module the source names in a string
            for other in named:
                self.add(other, node)
        else:
            self.unresolved.append((f"{self.path}:{node.lineno}", text))


def read_graph(root: Path = CORE) -> Graph:
    """Every import of every module under ``root`` (see the module's docstring for what resolves)."""
    modules = module_files(root)
    public = public_names(root / "__init__.py")
    edges, outside, unresolved = [], [], []
    for name, path in modules.items():
        source = path.read_text()
        reader = _Reader(name, path, root, source, modules, public)
        reader.read(ast.parse(source, filename=str(path)))
        for imp in reader.found:
            if imp.target == "core" or imp.target.startswith("core."):
                edges.append(imp)
            else:
                outside.append(imp)
        unresolved += reader.unresolved
    return Graph(modules, edges, outside, unresolved, public)


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module, and modules that import
    themselves (Tarjan's algorithm), each sorted, largest first."""
    succ = {m: sorted({e.target for e in graph.edges if e.source == m}) for m in graph.modules}
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in succ[v]:
                found.append(sorted(component))

    for v in graph.modules:
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: (-len(c), c))


# ----------------------------------------------------------------------------------------------
# the drawing
# ----------------------------------------------------------------------------------------------
def to_dot(graph: Graph, layer_of=None) -> str:
    """The graph in Graphviz's dot language: one node per module, one arrow per importing pair of
    modules; with ``layer_of(module) -> (rank, name)``, the modules of a layer drawn in one box,
    the layers stacked in their order (the top one importing downwards)."""
    lines = ["// core's imports, read from the source by tests/core_imports_support.py.",
             f"// Regenerate: {REGENERATE}",
             "digraph core_imports {",
             "  rankdir=TB; newrank=true; node [shape=box, fontname=Helvetica, fontsize=10];",
             "  edge [color=gray40, arrowsize=0.6];"]
    layers: dict = {}
    for module in graph.modules:
        layers.setdefault(layer_of(module) if layer_of else (0, ""), []).append(module)
    for (rank, name), members in sorted(layers.items(), key=lambda kv: -kv[0][0]):
        if name:
            lines.append(f'  subgraph "cluster_{rank}" {{ label="{name}"; style=rounded; color=gray60;')
        lines += [f'    "{m}";' for m in sorted(members)]
        if name:
            lines.append("  }")
    for source, target in sorted({(e.source, e.target) for e in graph.edges if e.source != e.target}):
        lines.append(f'  "{source}" -> "{target}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_dot(layer_of, path: Path = DOT) -> str:
    """Write :func:`to_dot` of core's imports to ``path``, and an SVG beside it when Graphviz's
    ``dot`` program is installed; return the dot text."""
    text = to_dot(read_graph(), layer_of)
    Path(path).write_text(text)
    if shutil.which("dot"):
        subprocess.run(["dot", "-Tsvg", str(path), "-o", str(Path(path).with_suffix(".svg"))], check=True)
    return text
