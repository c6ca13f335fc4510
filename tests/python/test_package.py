"""matmul_client's shape as a package, with no server: what it exports,
where each public name comes from, and that its modules import one another
without a cycle."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import matmul_client

#: The public API: every name matmul_client exports, and the module that
#: defines it. Moving code between the private modules must leave the names
#: unchanged.
PUBLIC_API = {
    "BFLOAT16_DTYPE": "_tensors",
    "CLIENT_ID_METADATA_KEY": "_client",
    "Client": "_client",
    "DEFAULT_OPTIONS": "_channel",
    "Device": "_info",
    "Handle": "_handles",
    "Limits": "_info",
    "MatmulError": "_errors",
    "ServerInfo": "_info",
    "TlsConfig": "_channel",
    "bfloat16_bits_to_float32": "_tensors",
    "float32_to_bfloat16_bits": "_tensors",
}


def test_public_api_is_unchanged() -> None:
    assert sorted(matmul_client.__all__) == sorted(PUBLIC_API)
    for name in matmul_client.__all__:
        assert hasattr(matmul_client, name), name


def test_public_classes_and_functions_name_their_module() -> None:
    for name, module in PUBLIC_API.items():
        value = getattr(matmul_client, name)
        if hasattr(value, "__module__") and callable(value):
            assert value.__module__ == f"matmul_client.{module}", name


def _package_imports() -> Dict[str, Set[str]]:
    """For each module of the package (not the generated _proto stubs), the
    package modules it imports, read from its source: every import counts,
    including those under ``if TYPE_CHECKING:`` and inside functions."""
    directory = Path(matmul_client.__file__).parent
    modules = {path.stem: path for path in directory.glob("*.py")}
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        imported: Set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module:  # from ._x import y
                    imported.add(node.module.split(".")[0])
                elif node.level == 1:  # from . import _x
                    imported.update(alias.name for alias in node.names)
                elif node.level == 0 and (node.module or "").startswith("matmul_client."):
                    imported.add(node.module.split(".")[1])
            elif isinstance(node, ast.Import):
                imported.update(
                    alias.name.split(".")[1] for alias in node.names if alias.name.startswith("matmul_client.")
                )
        graph[name] = {module for module in imported if module in modules and module != name}
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    cycles: List[List[str]] = []
    state: Dict[str, int] = {}  # 1: on the current path, 2: done.

    def visit(module: str, path: List[str]) -> None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                cycles.append(path[path.index(imported) :] + [imported])
            elif imported not in state:
                visit(imported, path)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return cycles


def test_the_graph_reader_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_package() -> None:
    graph = _package_imports()
    assert "_client" in graph and "_handles" in graph["_client"]  # the reader reads
    assert _cycles(graph) == []
