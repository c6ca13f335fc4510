#!/bin/sh
# python-site.sh DIR: what torch_server.py and check_server.py need on the
# GPU host beside its own Python 3.12, PyTorch and numpy, in one folder to
# carry there (about 15 MiB):
#   DIR/grpc                 grpcio for CPython 3.12 on x86-64 (manylinux)
#   DIR/matmul/v1            the messages and stubs of build/compare/python
#   DIR/fallback/google      protobuf, pure Python, for a host without it
# No package index is reachable from this machine, so grpcio comes from a
# Python 3.12 here that has one: $GRPC_PY312 if set, else the Python 3.12
# bundled with google-cloud-cli (grpcio 1.71.0). protobuf comes from
# Debian's python3-protobuf (4.21, run with
# PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python: its C module is 3.11's).
# Use on the GPU host (README.md): PYTHONPATH=DIR, plus DIR/fallback where
# `python3 -c 'import google.protobuf'` fails.
set -eu
out=${1:?usage: python-site.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)
stubs=$here/../../build/compare/python/matmul
py=${GRPC_PY312:-/usr/lib/google-cloud-sdk/platform/bundledpythonunix/bin/python3}
grpc=$("$py" -c 'import sys, grpc, os; assert sys.version_info[:2] == (3, 12); print(os.path.dirname(grpc.__file__))') ||
  { echo "python-site.sh: no Python 3.12 with grpc at $py; set GRPC_PY312" >&2; exit 1; }
pb=$(/usr/bin/python3 -c 'import google.protobuf as p, os; print(os.path.dirname(p.__file__))') ||
  { echo "python-site.sh: no protobuf for /usr/bin/python3 (apt-get install python3-protobuf)" >&2; exit 1; }
[ -f "$stubs/v1/matmul_pb2_grpc.py" ] ||
  { echo "python-site.sh: build bench/compare first (README.md)" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out/matmul" "$out/fallback/google"
cp -r "$grpc" "$out/grpc"
cp -r "$stubs/v1" "$out/matmul/v1"
cp -r "$pb" "$out/fallback/google/protobuf"
find "$out/fallback" -name '*.so' -delete
find "$out" -name __pycache__ -prune -exec rm -rf {} +
echo "python-site.sh: grpcio $("$py" -c 'import grpc; print(grpc.__version__)'), protobuf $(/usr/bin/python3 -c 'import google.protobuf as p; print(p.__version__)'), $(du -sh "$out" | cut -f1) in $out"
