"""matmul_client as a package: what it exports, where each public name comes
from, that its modules import one another without a cycle, its version, and
that the package the tests run against is the installed one (ctest runs them
with the Python of build/python-venv, where pip installed ./client/python)."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import site
import sys
from pathlib import Path
from typing import Dict, List, Set

import numpy as np
import pytest

import matmul_client

_REPO_ROOT = Path(__file__).resolve().parents[2]

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


def _project_version() -> str:
    """The CMake project version: $MATMUL_PROJECT_VERSION (ctest passes
    PROJECT_VERSION), else project(matmul VERSION ...) read here."""
    if os.environ.get("MATMUL_PROJECT_VERSION"):
        return os.environ["MATMUL_PROJECT_VERSION"]
    text = (_REPO_ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"^project\(matmul VERSION (\S+)", text, re.MULTILINE)
    assert match, "no project(matmul VERSION ...) in CMakeLists.txt"
    return match.group(1)


def _inside(path: str, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder.resolve())


def test_version_is_the_project_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", matmul_client.__version__), matmul_client.__version__
    assert matmul_client.__version__ == _project_version()


def _venv() -> Path:
    venv = os.environ.get("MATMUL_VENV")
    if not venv:
        pytest.skip("MATMUL_VENV unset: run from the build tree (PYTHONPATH), not an installed package")
    return Path(venv)


def test_the_installed_package_is_the_one_imported() -> None:
    venv = _venv()
    assert Path(sys.prefix).resolve() == venv.resolve(), "pytest does not run on the venv's Python"
    assert _inside(matmul_client.__file__, venv / "lib"), matmul_client.__file__
    # In the venv's site-packages, not build/python on a PYTHONPATH.
    site_packages = {Path(folder).resolve() for folder in site.getsitepackages()}
    assert Path(matmul_client.__file__).resolve().parent.parent in site_packages, matmul_client.__file__
    # Every module of the package, the generated stubs included.
    modules = {name: module for name, module in sys.modules.items() if name.startswith("matmul_client.")}
    assert "matmul_client._proto.matmul.v1.matmul_pb2_grpc" in modules
    for name, module in modules.items():
        if getattr(module, "__file__", None):
            assert _inside(module.__file__, venv / "lib"), (name, module.__file__)
    # pip's record of it agrees with the module.
    assert importlib.metadata.version("matmul-client") == matmul_client.__version__


def test_multiply_through_the_package_matches_numpy(client: matmul_client.Client) -> None:
    """Through whichever package was imported: the installed one under ctest
    (the test above checks that)."""
    rng = np.random.default_rng(19)
    a = rng.standard_normal((37, 53)).astype(np.float32)
    b = rng.standard_normal((53, 29)).astype(np.float32)
    c = client.multiply(a, b)
    assert c.dtype == np.float32 and c.shape == (37, 29)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)

    a64, b64 = rng.standard_normal((4, 8, 16)), rng.standard_normal((16, 5))
    np.testing.assert_allclose(client.multiply(a64, b64), a64 @ b64, rtol=1e-12, atol=1e-12)
    # The server built from this checkout reports the same version.
    assert client.server_info().version.startswith(matmul_client.__version__)


def test_installs_pure_python_without_cmake(server, tmp_path: Path) -> None:
    """Where the native core cannot be built (here: no cmake on PATH), pip
    still installs the package, says why, and it works on the pure-Python
    path, asyncio included."""
    import shutil
    import subprocess

    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("protoc", "grpc_python_plugin"):
        found = shutil.which(tool) or (os.environ.get("PROTOC") if tool == "protoc" else None)
        if not found:
            pytest.skip(f"{tool} is not on PATH")
        (tools / tool).symlink_to(found)
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PROTOC", "GRPC_PYTHON_PLUGIN")
                   and not k.startswith(("PIP_", "MATMUL_NATIVE"))}
    environment.update(PATH=str(tools), PIP_CONFIG_FILE=os.devnull)
    subprocess.run([base, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-v", "--no-build-isolation", "--no-index",
         "--no-cache-dir", "--disable-pip-version-check", str(_REPO_ROOT / "client" / "python")],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    assert "cmake is not on PATH" in install.stdout + install.stderr
    check = (
        "import asyncio, sys, numpy as np\n"
        "import matmul_client\n"
        "from matmul_client import _client\n"
        "from matmul_client.aio import AsyncClient\n"
        "assert _client.NATIVE_UNAVAILABLE is not None\n"
        "a, b = np.arange(6.0).reshape(2, 3), np.ones((3, 2))\n"
        "with matmul_client.Client(sys.argv[1], timeout=30) as c:\n"
        "    assert not c.native\n"
        "    np.testing.assert_array_equal(c.multiply(a, b), a @ b)\n"
        "async def main():\n"
        "    async with AsyncClient(sys.argv[1], timeout=30) as c:\n"
        "        assert not c.native\n"
        "        np.testing.assert_array_equal(await c.multiply(a, b), a @ b)\n"
        "asyncio.run(main())\n"
        "print('pure ok')\n"
    )
    run = subprocess.run([str(venv / "bin" / "python"), "-c", check, server.target], cwd=tmp_path,
                         env=environment, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "pure ok" in run.stdout, run.stdout + run.stderr
