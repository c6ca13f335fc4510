#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every check: the unit,
# integration and end-to-end tests (CTest), proto lint, formatting, and the
# deployment manifests. What CI runs (.ci/run calls this).
#
#   scripts/test.sh            all of it
#   BUILD_DIR=... scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

build=${BUILD_DIR:-build}
jobs=$(nproc)

step() { printf '\n== %s\n' "$*"; }

step "dependencies"
scripts/install-deps.sh

step "build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$jobs"

step "tests"
(cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 600)

step "sanitizers: ASan+UBSan and TSan (scripts/sanitize.sh)"
scripts/sanitize.sh

step "fuzzing: request parsing and validation, 60 s (scripts/fuzz.sh)"
scripts/fuzz.sh 60

step "buf lint (proto/)"
(cd proto && ../tools/node_modules/.bin/buf lint)

step "clang-format"
files=$(git ls-files '*.cc' '*.h' | grep -v '^third_party/')
clang-format --dry-run --Werror $files

step "deployment manifests"
scripts/check-deploy.sh

printf '\nall checks passed\n'
