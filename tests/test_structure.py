"""The package's dependencies point one way, down toward the core.

Read from the source with `ast`, not from what importing happens to run: an import inside a
function is a dependency all the same (it runs when the function does), so a cycle hidden
behind one is still a cycle.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "toolself"
ENTRY_POINTS = {"toolself.__main__"}  # `python -m toolself` is the command line itself
MAX_LINES = 550  # "about 500": a module that long holds more than one job
LONG_BY_NATURE = {"toolself.models.engine", "toolself.tools.sandbox"}


def module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def internal_imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The package's modules that `path` imports anywhere in it (module level, functions,
    `if TYPE_CHECKING:`), each resolved to the module it names: `from toolself.models import
    local` imports `toolself.models.local`, `from toolself.models import load_model` the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def private_imports(package: Path = PACKAGE) -> list[str]:
    """`module: name` for every `_name` a module of the package takes from another one."""
    found = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(package.name)):
                found += [f"{module_name(path, package)}: {alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    return sorted(found)


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    paths = {module_name(p, package): p for p in package.rglob("*.py")}
    return {name: internal_imports(path, name, set(paths)) for name, path in paths.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "toolself" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "toolself"


def test_no_module_of_the_package_takes_part_in_an_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_of_the_library_imports_the_command_line():
    importers = sorted(name for name, imports in import_graph().items()
                       if "toolself.cli" in imports and name not in ENTRY_POINTS)
    assert importers == []


def test_no_module_takes_another_modules_private_names():
    assert private_imports() == []


def test_a_private_name_taken_from_another_module_is_found(tmp_path):
    package = write_package(tmp_path, {"__init__.py": "", "runner.py": "def _run(): pass\n",
                                       "backends.py": "def f():\n    from toolself.runner import _run\n"})
    assert private_imports(package) == ["toolself.backends: _run"]


def test_no_module_but_the_engine_and_the_sandbox_runs_past_about_500_lines():
    long = {module_name(path, PACKAGE) for path in PACKAGE.rglob("*.py")
            if len(path.read_text(encoding="utf-8").splitlines()) > MAX_LINES}
    assert long <= LONG_BY_NATURE


def test_a_cycle_closed_by_an_import_inside_a_function_is_found(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from toolself.high import g\n    return g\n",
        "high.py": "from toolself import low\n",
    })
    assert sorted(set(find_cycle(import_graph(package)) or [])) == ["toolself.high", "toolself.low"]


@pytest.mark.parametrize("statement", ["from .high import g", "from toolself.high import g", "import toolself.high",
                                       "from toolself import high"])
def test_every_spelling_of_an_import_is_an_edge(tmp_path, statement):
    package = write_package(tmp_path, {"__init__.py": "", "low.py": statement + "\n", "high.py": "g = 1\n"})
    assert import_graph(package)["toolself.low"] == {"toolself.high"}


def test_a_package_that_imports_one_way_has_no_cycle(tmp_path):
    package = write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "x = 1\n",
        "high.py": "def f():\n    from toolself.low import x\n    return x\n",
    })
    assert find_cycle(import_graph(package)) is None


def module_level_path_changes(source: str) -> list[int]:
    """Lines where a module touches `sys.path` as it is imported (outside any function)."""
    lines, pending = [], list(ast.parse(source).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            lines.append(node.lineno)
        pending.extend(ast.iter_child_nodes(node))
    return sorted(lines)


def test_no_test_module_changes_sys_path_as_it_is_collected():
    # All test modules are imported into each worker: one that put benchmarks/ first on the
    # path made `import ray` in a later one find benchmarks/ray.py instead of the package.
    tests = Path(__file__).resolve().parent
    changed = {p.name: found for p in sorted(tests.glob("*.py"))
               if (found := module_level_path_changes(p.read_text(encoding="utf-8")))}
    assert changed == {}


def test_a_test_module_that_puts_a_folder_on_sys_path_is_found():
    assert module_level_path_changes("import sys\nsys.path.insert(0, 'benchmarks')\n") == [2]
    assert module_level_path_changes("import sys\nsys.path[:] = []\n") == [2]
    assert module_level_path_changes("import sys\ndef f():\n    sys.path.insert(0, 'x')\n") == []
