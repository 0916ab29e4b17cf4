"""The architecture as a test: imports flow adapters -> engine -> api; inside api, packages stand on floors and import
only their own floor or lower; neither modules nor packages form a cycle; and no module imports a project module
inside a function (the usual way to hide a cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("adapters", "engine", "api")
# What each package may import of the project.
ALLOWED = {"adapters": {"adapters"}, "engine": {"adapters", "engine"}, "api": {"adapters", "engine", "api"}}
# Imports inside a function for a reason other than a cycle, and the reason.
LAZY = {
    "api.cli.serve": "the server imports vLLM (seconds); `loraplex adapters` and `keys` start without it; "
                     "Ray (api.cluster.serve) is imported only with --replicas",
    "engine.worker.plugin": "vLLM calls register() while importing itself; the ops modules import vLLM",
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = modules()


def project_imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, at module level) for every import of a project package in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    for node in tree.body:  # `if TYPE_CHECKING:` blocks and the like count as module level
        if isinstance(node, (ast.If, ast.Try)):
            top_level |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name.split(".")[0] in PACKAGES:
                found.append((_module_of(name), id(node) in top_level))
    return found


def _module_of(name: str) -> str:
    """The project module an import names (`from a.b import c` names a.b unless a.b.c is a module)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_flow_one_way(module):
    package = module.split(".")[0]
    wrong = sorted({name for name, _ in project_imports(MODULES[module]) if name.split(".")[0] not in ALLOWED[package]})
    assert not wrong, f"{module} ({package}) imports {wrong}; allowed: {sorted(ALLOWED[package])}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_project_import_inside_a_function(module):
    inside = sorted({name for name, top in project_imports(MODULES[module]) if not top})
    assert not inside or module in LAZY, f"{module} imports {inside} inside a function"


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the directed graph as [a, b, ..., a], or [] when there is none."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        stack, on_path = [(start, iter(sorted(graph[start])))], [start]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.pop()
                done.add(node)
            elif child in on_path:
                return on_path[on_path.index(child):] + [child]
            elif child not in done:
                stack.append((child, iter(sorted(graph.get(child, ())))))
                on_path.append(child)
    return []


@pytest.mark.parametrize(("graph", "cycle"), [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
    ({"a": {"b"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
    ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, []),
])
def test_find_cycle(graph, cycle):
    assert find_cycle(graph) == cycle


def test_no_import_cycle():
    graph = {m: {name for name, top in project_imports(p) if top and name != m and name in MODULES}
             for m, p in MODULES.items()}
    # `import a.b.c` runs a/__init__ and a/b/__init__ first.
    for m in list(graph):
        graph[m] |= {parent for name in graph[m] for parent in _parents(name) if parent in MODULES and parent != m}
    assert find_cycle(graph) == []


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


# api's packages (a sub-package, or a module directly under api, is one node), lowest floor first. A package imports
# packages of its own floor or below; a new package is placed here before it can land.
API_FLOORS: list[tuple[str, set[str]]] = [
    ("HTTP nouns: errors, bodies, input limits, the server's protocol and lifecycle",
     {"api.errors", "api.http_protocol", "api.body", "api.input_limits", "api.middleware", "api.lifecycle"}),
    ("metrics, SLOs, history, drift", {"api.observability"}),
    ("tenants: the tenants file, keys, limits, admission, ledger", {"api.tenancy"}),
    ("who is calling", {"api.auth"}),
    ("the steps of a request; operations and the registry admin API", {"api.generation", "api.ops", "api.admin"}),
    ("routing: rollouts, shadows, fallbacks, breakers", {"api.routing"}),
    ("the request pipeline, step by step", {"api.pipeline"}),
    ("the OpenAI endpoints", {"api.openai"}),
    ("features over the OpenAI endpoints", {"api.batch", "api.graphs", "api.responses", "api.sagemaker"}),
    ("async jobs (over batch)", {"api.jobs"}),
    ("the configuration and the server, assembled", {"api.config", "api.server"}),
    ("the gRPC front", {"api.grpc"}),
    ("the app, scale-out and the command line", {"api.app", "api.cluster", "api.cli"}),
]


def package_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {package_of(m): set() for m in MODULES}
    for module, path in MODULES.items():
        for name, _ in project_imports(path):
            if package_of(name) != package_of(module):
                graph[package_of(module)].add(package_of(name))
    return graph


def test_every_api_package_stands_on_a_floor():
    placed = [p for _, floor in API_FLOORS for p in floor]
    packages = {p for p in package_graph() if p.startswith("api.")}
    assert len(placed) == len(set(placed)), "a package on two floors"
    assert packages == set(placed), f"not placed: {sorted(packages - set(placed))}; gone: {sorted(set(placed) - packages)}"


@pytest.mark.parametrize("package", sorted({p for _, floor in API_FLOORS for p in floor}))
def test_packages_import_only_their_floor_or_below(package):
    floor_of = {p: i for i, (_, floor) in enumerate(API_FLOORS) for p in floor}
    above = sorted(name for name in package_graph().get(package, ()) if floor_of.get(name, -1) > floor_of[package])
    assert not above, (f"{package} ({API_FLOORS[floor_of[package]][0]}) imports {above}, which stand above it: "
                       "move the shared nouns down")


def test_no_package_cycle():
    assert find_cycle(package_graph()) == []
