"""The structure of `orchestra_sup/`, measured from its imports: cycles, sizes, layers.

    python3 scripts/structure.py [--json]

Prints, in order:
- import cycles between modules, counting imports inside functions (only imports under
  `if TYPE_CHECKING:` are left out: they never run), and between parts (packages and
  top-level modules);
- modules over `MAX_LINES` lines;
- imports that break the layer rule (`docs/architecture.md`, "What may import what");
- lines per package.

Exits 1 when there is a cycle of either kind, a module over the limit or a broken rule, else 0.
The rule itself is `LAYERS` and `ROLES` below; `tests/unit/test_layers.py` runs the same checks
in CI.
Standard library only, so it runs before any setup.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

PACKAGE = "orchestra_sup"
PACKAGE_DIR = Path(__file__).resolve().parent.parent / PACKAGE
MAX_LINES = 600
"""Lines a module may hold (issue 18)."""

LAYERS: dict[str, int] = {
    "errors": 0,  # every exception and error code
    "transitions": 1,  # a state machine's allowed-transitions table (tasks, lanes, children)
    "system": 1,  # OS seams: Linux calls, descriptors, titles, cgroups, isolation, lane uids
    "logformat": 1,  # how every process writes its log
    "configfile": 1,  # reading a config file, and showing its values, within bounds
    "cluster": 2,  # etcd: its client, a host's lease, lanes' fences, [cluster]
    "protocol": 3,  # the wire: frames, codec, endpoints, keys, names, a child's arguments
    "histogram": 4,  # latency buckets (their wire form is a frame)
    "release": 4,  # what a release is and which protocols it speaks
    "config": 4,  # the tree's config file
    "paths": 4,  # where a tree keeps its files
    "state": 5,  # the LMDB state plane
    "runtime": 6,  # the process a role runs in: its loop, its sockets, its heartbeats
    "coordinator": 7,  # the roles: one package each, talking over the wire only
    "custodian": 7,
    "shards": 7,
    "node": 8,  # a child's entry point and the fork template: picks and runs a role
    "web": 8,  # the HTTP API the supervisor serves: ctl's requests as JSON, events as SSE
    "supervisor": 9,  # the root supervisor, which starts the children
    "client": 10,  # driving a tree from a program: the ctl client, the SDK, a private tree
    "bench": 11,  # the benchmarks, run through the client
    "cli": 12,  # the `orchestra-sup` command
    "__main__": 13,
    # The package's public face (the SDK's clients, the version) imports its top parts lazily
    # (PEP 562), so it sits above them all: no part of the package imports `orchestra_sup`.
    "__init__": 13,
}
"""Each top-level part of the package and its layer: a module may import its own part and
parts of lower layers, never one of its own layer or above."""

ROLES = frozenset({"coordinator", "custodian", "shards"})
"""Role packages: none may import another (they talk over the wire only)."""


def part_of(module: str) -> str:
    """`orchestra_sup.shards.role` -> `shards`; `orchestra_sup` -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(root: Path, path: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, module: str, known: set[str]) -> set[str]:
    """Modules of ours that `path` imports at run time (top level or inside functions)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    resolved = set()
    for name in found:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module and name.startswith(PACKAGE):
            resolved.add(name)
    return resolved


def graph(root: Path) -> tuple[dict[str, set[str]], dict[str, int]]:
    """Module -> modules it imports, and module -> lines."""
    paths = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    known = set(paths)
    edges = {m: imports_of(p, m, known) for m, p in paths.items()}
    lines = {m: len(p.read_text().splitlines()) for m, p in paths.items()}
    return edges, lines


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def strong(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
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
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sorted(found)


def broken_rules(edges: dict[str, set[str]]) -> list[str]:
    """One line per import the layer rule forbids: `a -> b: why`."""
    broken = []
    for module in sorted(edges):
        here = part_of(module)
        for target in sorted(edges[module]):
            there = part_of(target)
            if here == there:
                continue
            if here not in LAYERS or there not in LAYERS:
                unknown = here if here not in LAYERS else there
                broken.append(f"{module} -> {target}: part {unknown!r} has no layer")
            elif here in ROLES and there in ROLES:
                broken.append(f"{module} -> {target}: a role imports another role")
            elif LAYERS[there] >= LAYERS[here]:
                broken.append(
                    f"{module} -> {target}: layer {LAYERS[here]} ({here}) imports "
                    f"layer {LAYERS[there]} ({there})"
                )
    return broken


def measure(root: Path) -> dict:
    edges, lines = graph(root)
    by_size = sorted(lines.items(), key=lambda item: -item[1])
    per_part: dict[str, int] = {}
    for module, count in lines.items():
        per_part[part_of(module)] = per_part.get(part_of(module), 0) + count
    parts: dict[str, set[str]] = {}
    for module, targets in edges.items():
        parts.setdefault(part_of(module), set()).update(
            part_of(target) for target in targets if part_of(target) != part_of(module)
        )
    return {
        "modules": len(lines),
        "cycles": cycles(edges),
        "part_cycles": cycles(parts),
        "over_limit": {m: n for m, n in by_size if n > MAX_LINES},
        "largest": dict(by_size[:8]),
        "broken_rules": broken_rules(edges),
        "lines_per_part": dict(sorted(per_part.items(), key=lambda i: -i[1])),
    }


def main(argv: list[str]) -> int:
    facts = measure(PACKAGE_DIR)
    if "--json" in argv:
        print(json.dumps(facts, indent=2))
    else:
        print(f"modules: {facts['modules']}")
        print(f"import cycles: {len(facts['cycles'])}")
        for component in facts["cycles"]:
            print(f"  {len(component)} modules: {', '.join(component)}")
        print(f"cycles between parts (packages, top-level modules): {len(facts['part_cycles'])}")
        for component in facts["part_cycles"]:
            print(f"  {', '.join(component)}")
        print(f"modules over {MAX_LINES} lines: {len(facts['over_limit'])}")
        for module, count in facts["largest"].items():
            mark = "  over" if count > MAX_LINES else ""
            print(f"  {count:5d}  {module}{mark}")
        print(f"imports against the layer rule: {len(facts['broken_rules'])}")
        for line in facts["broken_rules"]:
            print(f"  {line}")
        print("lines per part:")
        for part, count in facts["lines_per_part"].items():
            print(f"  {count:6d}  {part}")
    bad = facts["cycles"] or facts["part_cycles"] or facts["over_limit"] or facts["broken_rules"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
