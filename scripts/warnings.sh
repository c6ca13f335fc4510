#!/usr/bin/env bash
# Builds the whole tree (libraries, server, client tools, tests; the CUDA
# engine too where the toolkit is installed) with clang-14, warnings as
# errors and clang's thread-safety analysis (-Wthread-safety: every
# ABSL_GUARDED_BY field read or written without its mutex, every
# ABSL_EXCLUSIVE_LOCKS_REQUIRED function called without it, fails the
# build). Nothing is run: the gcc build runs the tests.
#
#   scripts/warnings.sh            build dir build-clang (WARNINGS_BUILD_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${WARNINGS_BUILD_DIR:-build-clang}

if ! command -v clang++-14 >/dev/null; then
  echo "warnings.sh: clang++-14 not found (Debian: clang-14)" >&2
  exit 1
fi
start=$(date +%s)
CC=clang-14 CXX=clang++-14 cmake -S . -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON -DMATMUL_WERROR=ON \
  -DMATMUL_SANITIZE= -DMATMUL_FUZZ=OFF >/dev/null
cmake --build "$build" -j "$(nproc)"
# The translation units checked: the project's own, not generated code.
units=$(/usr/bin/python3 -c '
import json, sys
cmds = json.load(open(sys.argv[1] + "/compile_commands.json"))
print(sum(1 for c in cmds if "/" + sys.argv[1] + "/" not in c["file"]))
' "$build")
echo "warnings: $units translation units, clang-14 -Wall -Wextra -Wthread-safety -Werror, $(($(date +%s) - start)) s"
