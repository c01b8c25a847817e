"""The import graph: ``readers`` loads no writer, and no module of packer or readers imports itself
back through another (imports inside functions count: they are cycles deferred, not removed)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("packer", "readers")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of packer and readers it imports (at run time, anywhere in it)."""
    modules = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from packer import x`` may name a submodule
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            if _type_checking_only(node, parents):
                continue
            found.update(t for t in targets if t in modules and t != name)
        graph[name] = found
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as a list of modules (first repeated at the end), or [] when there is none."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt in PACKAGES:  # a package's __init__ re-exports; ``import packer.x`` runs it first anyway
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return []


def test_no_import_cycles():
    graph = import_graph()
    assert "packer.ops.convert" in graph and "readers.datasets.base" in graph  # the walk found the modules
    assert find_cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_packer_core_never_imports_readers():
    """The converter's modules do not depend on the readers; only the CLI (the user's boundary,
    whose inspection and advisor commands read outputs) may."""
    graph = import_graph()
    offenders = {
        m: sorted(d for d in deps if d.split(".")[0] == "readers")
        for m, deps in graph.items()
        if m.startswith("packer") and not m.startswith(("packer.cli", "packer.advisor"))
    }
    assert {m: d for m, d in offenders.items() if d} == {}


def test_import_readers_loads_no_writer():
    code = (
        "import sys, readers; "
        "print(','.join(sorted(m for m in sys.modules if m.startswith(('packer.formats', 'packer.ops', "
        "'packer.run', 'packer.sources', 'packer.targets', 'packer.output', 'packer.config', 'h5py', 'lmdb')))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    # h5py and lmdb belong to their readers; the writers' modules and the converter must stay unloaded
    assert [m for m in loaded.stdout.strip().split(",") if m.startswith("packer")] == []


def test_the_file_stamp_imports_nothing_of_packer():
    """``packer.spec.file_stamp`` is shared by the converter and the readers (which stamp the files they
    open): it must stay a leaf, loading no other module of packer."""
    assert import_graph()["packer.spec.file_stamp"] == set()


SHARED_WITH_READERS = ("packer.spec", "packer.pixels")
"""The part of packer the readers share: what every output is (``packer.spec``) and the pixel rules
(``packer.pixels``: the readers' crops decode stored and source images, and place boxes, as the
converter did). Beside them only the package itself and two top-level modules: the settings
(``packer.config``, whose ``PreprocessConfig`` is the manifest's preprocessing) and the host
(``packer.system``: the cores a process may use)."""
SHARED_TOP_LEVEL = frozenset({"packer", "packer.config", "packer.system"})


def shared(module: str) -> bool:
    """Whether ``module`` belongs to the part of packer the readers may import."""
    return (
        module in SHARED_TOP_LEVEL
        or module.startswith(tuple(p + "." for p in SHARED_WITH_READERS))
        or (module in SHARED_WITH_READERS)
    )


def test_readers_reach_only_the_part_of_packer_they_share():
    graph = import_graph()
    reached: set[str] = set()
    todo = [d for m, deps in graph.items() if m.startswith("readers") for d in deps if d.startswith("packer")]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += [d for d in graph.get(module, ()) if d.startswith("packer")]
    assert (
        "packer.spec.manifest" in reached and "packer.spec.field_kinds" in reached
    )  # the walk found the readers' imports
    assert sorted(m for m in reached if not shared(m)) == [], "readers reach packer modules outside the shared part"


def test_the_spec_imports_nothing_of_packer_outside_itself():
    """``packer.spec`` is what every output is: the readers share it, so it must not pull in a stage."""
    graph = import_graph()
    assert "packer.spec.manifest" in graph  # the walk found the spec
    outside = {
        m: sorted(d for d in deps if not d.startswith("packer.spec"))
        for m, deps in graph.items()
        if m.startswith("packer.spec.")
    }
    assert {m: d for m, d in outside.items() if d} == {}


def test_only_the_commands_import_the_operations():
    """The stages below the operations never import ``packer.ops`` or ``packer.cli``: an operation
    composes the stages, a command runs an operation."""
    graph = import_graph()
    above = ("packer.ops", "packer.cli")
    offenders = {
        m: sorted(d for d in deps if d.startswith(above))
        for m, deps in graph.items()
        if m.startswith("packer") and not m.startswith((*above, "packer.__main__"))
    }
    assert {m: d for m, d in offenders.items() if d} == {}
