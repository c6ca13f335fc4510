#!/usr/bin/env python3
"""Generates matmul_client's protobuf and gRPC modules, and reads the version.

One implementation for both builds of the package:

- the CMake build (client/python/CMakeLists.txt) runs it as a script to fill
  build/python/matmul_client/_proto;
- the pip build (setup.py) imports it to fill the wheel's matmul_client/_proto
  and to read the version from the top-level CMakeLists.txt.

protoc writes ``matmul/v1/matmul_pb2.py`` and grpc_python_plugin
``matmul/v1/matmul_pb2_grpc.py`` (likewise for grpc/health/v1/health.proto);
their absolute imports (``from matmul.v1 import matmul_pb2``) are rewritten
into ``from matmul_client._proto.matmul.v1 import ...``, so that the stubs are
a subpackage of matmul_client and never clash with other copies of the same
protos. Standard library only.

    build_stubs.py --out DIR --proto-path ROOT [--proto-path ROOT...]
                   [--protoc PROTOC] [--grpc-python-plugin PLUGIN]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

#: The protos of the package, relative to their --proto-path roots.
PROTOS = ("matmul/v1/matmul.proto", "grpc/health/v1/health.proto")

_IMPORT = re.compile(r"^from (matmul|grpc\.health)\.", re.MULTILINE)
_PROJECT_VERSION = re.compile(r"\bproject\s*\(\s*matmul\b[^)]*?\bVERSION\s+([0-9]+(?:\.[0-9]+){0,3})\b", re.DOTALL)


def project_version(cmakelists: Path) -> str:
    """The VERSION of ``project(matmul VERSION x.y.z ...)`` in ``cmakelists``."""
    match = _PROJECT_VERSION.search(cmakelists.read_text())
    if not match:
        raise RuntimeError(f"{cmakelists}: no 'project(matmul VERSION x.y.z ...)'")
    return match.group(1)


def write_version(path: Path, version: str) -> None:
    """Writes the package's _version.py (the CMake build writes the same line)."""
    path.write_text(f'__version__ = "{version}"\n')


def find_tool(name: str, environment_variable: str) -> str:
    """``$environment_variable`` if set, else ``name`` on PATH."""
    tool = os.environ.get(environment_variable) or shutil.which(name)
    if not tool:
        raise RuntimeError(
            f"{name} not found on PATH (or set {environment_variable}); "
            f"Debian: apt-get install protobuf-compiler protobuf-compiler-grpc")
    return tool


def _locate(proto: str, roots: Sequence[Path]) -> Path:
    for root in roots:
        if (root / proto).is_file():
            return root / proto
    raise RuntimeError(f"{proto} is in none of {', '.join(map(str, roots))}")


def generate(out: Path, proto_roots: Sequence[Path], protoc: Optional[str] = None,
             grpc_python_plugin: Optional[str] = None) -> None:
    """Writes the stubs of PROTOS under ``out`` (matmul_client/_proto), with
    their imports rewritten and an __init__.py in every directory."""
    protoc = protoc or find_tool("protoc", "PROTOC")
    plugin = grpc_python_plugin or find_tool("grpc_python_plugin", "GRPC_PYTHON_PLUGIN")
    for proto in PROTOS:
        _locate(proto, proto_roots)
    out.mkdir(parents=True, exist_ok=True)
    command = [protoc, *(f"--proto_path={root}" for root in proto_roots),
               f"--python_out={out}", f"--grpc_out={out}",
               f"--plugin=protoc-gen-grpc={plugin}", *PROTOS]
    subprocess.run(command, check=True)

    for proto in PROTOS:
        stem = out / proto[: -len(".proto")]
        for stub in (stem.with_name(stem.name + "_pb2.py"), stem.with_name(stem.name + "_pb2_grpc.py")):
            stub.write_text(_IMPORT.sub(r"from matmul_client._proto.\1.", stub.read_text()))
        directory = stem.parent
        while directory != out.parent:
            (directory / "__init__.py").touch()
            directory = directory.parent


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the package's _proto directory")
    parser.add_argument("--proto-path", type=Path, action="append", required=True,
                        help="a root the protos are found under (repeatable)")
    parser.add_argument("--protoc", help="protoc (default: $PROTOC, else PATH)")
    parser.add_argument("--grpc-python-plugin", help="grpc_python_plugin (default: $GRPC_PYTHON_PLUGIN, else PATH)")
    args = parser.parse_args(argv)
    try:
        generate(args.out, args.proto_path, args.protoc, args.grpc_python_plugin)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        print(f"build_stubs.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
