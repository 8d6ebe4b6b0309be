"""The package's shape, checked from its source: where IPython may be imported, no import cycles,
no class over 250 lines, every folder says what lives in it, and help(torchmagic) lists the API."""

from __future__ import annotations

import ast
import pydoc
from pathlib import Path

import torchmagic

PACKAGE = Path(torchmagic.__file__).parent
FRONTEND = ("IPython", "ipywidgets", "ipykernel")
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 6  # not counting self or cls
# The API twins take each of their magic's options as a keyword, as the magic takes flags: the
# exception kept (a user writes torchmagic.profile(fn, steps=5, warmup=1), not an options object).
API_TWINS = {"torchmagic.api.profile", "torchmagic.api.profile_ranks", "torchmagic.api.compare",
             "torchmagic.api.autobatch", "torchmagic.api.autobatch_ranks", "torchmagic.api.loadertune"}


def _modules() -> dict[str, Path]:
    """Dotted module name → file, for every module in the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(module: str, path: Path, include_type_checking: bool = False) -> list[tuple[str, int]]:
    """(absolute module imported, line) for each import in the file, inside functions too;
    imports under ``if TYPE_CHECKING:`` only with ``include_type_checking``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    skipped: set[int] = set()
    if not include_type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
                skipped.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.append((target, node.lineno))
            found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]  # from . import x
    return found


def _may_import_frontend(module: str) -> bool:
    leaf = module.rpartition(".")[2]
    return (module.startswith("torchmagic.features.") and leaf in ("magic", "view")) or \
        module == "torchmagic.core.ipython" or module.startswith("torchmagic.core.render")


def test_only_magics_and_views_import_ipython_or_widgets():
    wrong = [f"{module}:{line} imports {name}"
             for module, path in _modules().items() if not _may_import_frontend(module)
             for name, line in _imports(module, path) if name.split(".")[0] in FRONTEND]
    assert wrong == [], "engines and results must run without IPython:\n" + "\n".join(wrong)


def test_there_is_no_import_cycle():
    modules = _modules()
    graph = {m: {name for name, _ in _imports(m, p) if name in modules and name != m} for m, p in modules.items()}
    # a package's __init__ is imported before any of its modules: an edge to a package is not a cycle
    # through its modules unless its __init__ imports them, which the graph already has
    state: dict[str, int] = {}
    cycles = []

    def visit(m, trail):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(trail[trail.index(n):] + [n]))
            elif n not in state:
                visit(n, trail + [n])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_no_class_is_over_250_lines():
    long = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                long.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert long == []


def _functions():
    """(qualified name, lines, parameters) of every function and method in the package."""
    for module, path in _modules().items():
        tree = ast.parse(path.read_text())
        scopes = [(tree, module)]
        while scopes:
            node, prefix = scopes.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = child.args
                    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                    count = len(names) + bool(a.vararg) + bool(a.kwarg) - (names[:1] in (["self"], ["cls"]))
                    yield f"{prefix}.{child.name}", child.end_lineno - child.lineno + 1, count
                    scopes.append((child, f"{prefix}.{child.name}"))
                elif isinstance(child, ast.ClassDef):
                    scopes.append((child, f"{prefix}.{child.name}"))


def test_no_function_is_over_60_lines_or_6_parameters_but_the_api_twins_keywords():
    over = {}
    for name, lines, parameters in _functions():
        if lines > MAX_FUNCTION_LINES:
            over[name, "lines"] = lines
        if parameters > MAX_PARAMETERS and name not in API_TWINS:
            over[name, "parameters"] = parameters
    assert not over, f"over the limits ({MAX_FUNCTION_LINES} lines, {MAX_PARAMETERS} parameters): {over}"


def test_each_feature_folder_has_the_same_shape_and_says_what_it_holds():
    features = [p for p in (PACKAGE / "features").iterdir() if (p / "__init__.py").exists()]
    assert {p.name for p in features} >= {"profile", "compare", "autobatch", "memory", "loadertune"}
    for folder in [PACKAGE, PACKAGE / "core", PACKAGE / "features", *features,
                   *(p for p in (PACKAGE / "core").iterdir() if (p / "__init__.py").exists())]:
        assert ast.get_docstring(ast.parse((folder / "__init__.py").read_text())), f"{folder}: no docstring"
    for folder in features:
        assert {"magic.py", "run.py", "result.py"} <= {p.name for p in folder.iterdir()}, folder


def test_help_lists_the_api():
    text = pydoc.render_doc(torchmagic, renderer=pydoc.plaintext)
    for name in ("profile", "profile_code", "compare", "autobatch", "loadertune", "memory", "measure_memory",
                 "free", "watch_memory", "analyze", "profile_ranks", "autobatch_ranks", "diff", "use_device", "ProfileResult", "CompareResult", "Variant",
                 "TraceAnalysis", "ProfileDiff"):
        assert f"{name}(" in text or f"class {name}" in text, f"help(torchmagic) does not list {name}"


def test_no_module_imports_another_modules_private_names():
    private = []
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("torchmagic")):
                private += [f"{module}:{node.lineno} imports {alias.name}" for alias in node.names
                            if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert private == [], "a name another module uses is public: drop its underscore\n" + "\n".join(private)
