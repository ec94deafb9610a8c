"""The import graph of ``localbook``: no cycle, and no import running up the layering that
CONTRIBUTING.md writes down. Every import counts, at module level or inside a function (a lazy
import still ties the two modules together)."""

import ast
from pathlib import Path


PKG = Path(__file__).resolve().parents[1] / "localbook"

#: The layers, lowest first (CONTRIBUTING.md, "Layering"). A module imports only from lower
#: layers; chapter modules (layer 5) may also import each other, without cycles.
LAYERS = [
    # 0: no localbook imports at all
    {"compiled", "chunks", "widgets"},
    # 1: argument checks; glue and progress bars
    {"_validate", "notebook"},
    # 2: kernel profiles and distances; the data files; scores
    {"kernels", "fashion_mnist", "metrics"},
    # 3: the differentiable reduction (its backward pass)
    {"local_grad"},
    # 4: the reduction engine; every data generator
    {"local_sums", "datasets"},
    # 5: the chapter modules, everything not named elsewhere
    None,
    # 6: namespaces built on the chapters
    {"plotting", "estimators", "sagl_study"},
    # 7: the package, which re-exports every layer
    {"__init__"},
]
MAX_LINES = 600


def _modules(pkg=PKG):
    return {p.stem: p for p in pkg.glob("*.py")}


def _imports(path: Path, known) -> set:
    deps = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
            elif node.level == 0 and (node.module or "").startswith("localbook."):
                names = [node.module.split(".", 1)[1]]
            else:
                continue
        elif isinstance(node, ast.Import):
            names = [
                a.name.split(".", 1)[1]
                for a in node.names
                if a.name.startswith("localbook.")
            ]
        else:
            continue
        deps |= {n.split(".")[0] for n in names if n and n.split(".")[0] in known}
    return deps


def _graph(pkg=PKG):
    mods = _modules(pkg)
    return {m: _imports(p, mods) - {m} for m, p in mods.items()}


def _layer(module: str) -> int:
    for i, layer in enumerate(LAYERS):
        if layer is not None and module in layer:
            return i
    return LAYERS.index(None)


def test_every_named_module_exists():
    mods = _modules()
    named = set().union(*(layer for layer in LAYERS if layer is not None))
    assert named <= set(mods), sorted(named - set(mods))


def test_no_import_cycle():
    graph = _graph()
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                cycles.append(path[path.index(d) :] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_import_runs_up_the_layering():
    chapter = LAYERS.index(None)
    upward = [
        f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
        for m, deps in _graph().items()
        for d in sorted(deps)
        if _layer(d) > _layer(m) or (_layer(d) == _layer(m) != chapter)
    ]
    assert not upward, upward


def test_no_module_is_longer_than_the_limit():
    long = {
        m: n
        for m, p in _modules().items()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them by idea): {long}"


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    (tmp_path / "chunks.py").write_text("import localbook.kernels\n")
    (tmp_path / "kernels.py").write_text("import torch\n")
    graph = _graph(tmp_path)
    assert graph["a"] == {"b"} and graph["b"] == {"a"}  # a lazy import counts
    assert graph["chunks"] == {"kernels"} and _layer("kernels") > _layer("chunks")
