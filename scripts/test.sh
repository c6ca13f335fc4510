#!/usr/bin/env bash
# Builds everything and runs every check, suite by suite, and ends with one
# table (suite, tests run, failed, skipped, seconds). Fails when a suite
# fails or runs no test. What CI runs (.ci/run calls this).
#
#   scripts/test.sh            all of it: dependencies, main build, unit,
#                              integration, python, e2e, deploy, gpu (skips
#                              without a GPU), C++ install, lint, clang warnings and
#                              thread-safety analysis, ASan+UBSan, TSan, fuzz
#   scripts/test.sh --quick    the contributor's loop: incremental main build,
#                              then unit, integration and python (host
#                              engine); no dependencies step, no sanitizer or
#                              fuzz builds
#   BUILD_DIR=... FUZZ_SECONDS=... scripts/test.sh
#
# The main build is configured here with every option it needs (tests on),
# whatever configured build/ before (scripts/demo.sh, a hand-run cmake).
# ccache entries are shared across checkouts and build folders (CMakeLists.txt
# sets CCACHE_BASEDIR to the checkout), so a fresh clone of code built before
# compiles almost nothing. docs/CONTRIBUTING.md has the times of each suite.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
root=$PWD

mode=full
case "${1:-}" in
  "") ;;
  --quick) mode=quick ;;
  -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac

build=${BUILD_DIR:-build}
jobs=$(nproc)
py=/usr/bin/python3
summary_py=$root/scripts/test_summary.py
results=$root/$build/test-results
mkdir -p "$results"
summary=$(mktemp)
trap 'rm -f "$summary"' EXIT

gpu_visible=0
nvidia-smi -L >/dev/null 2>&1 && gpu_visible=1

step() { printf '\n== %s\n' "$*"; }
# row SUITE RUN FAILED SKIPPED SECONDS [NOTE]
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$summary"; }

build_note=""
finish() {
  step "summary ($mode)"
  "$py" "$summary_py" table "$summary" --gpu-visible "$gpu_visible"
  local rc=$?
  [[ -n $build_note ]] && echo "$build_note"
  echo "test.sh $mode: $SECONDS s in all"
  ((rc == 0)) && printf '\nall checks passed\n'
  exit $rc
}

# ctest_suite SUITE BUILD_DIR [CTEST ARGS...]: the tests labelled SUITE.
ctest_suite() {
  local suite=$1 dir=$2
  shift 2
  step "$suite tests (ctest -L $suite)"
  local junit=$root/$dir/test-results/ctest-$suite.xml since t0
  rm -f "$junit"
  since=$(date +%s)
  t0=$SECONDS
  ctest --test-dir "$dir" -L "^$suite\$" --no-tests=error --output-on-failure \
    -j "$jobs" --timeout 600 --output-junit "$junit" "$@"
  local rc=$? run failed skipped
  read -r run failed skipped < <("$py" "$summary_py" count "$junit" \
    --pytest-dir "$root/$dir/test-results" --since "$since")
  # ctest itself failing (no tests, a crash in discovery) is a failure even
  # when the JUnit file has nothing in it.
  ((rc != 0 && failed == 0)) && failed=1
  row "$suite" "$run" "$failed" "$skipped" $((SECONDS - t0))
}

# "HITS MISSES" of ccache so far (0 0 without ccache).
ccache_counts() {
  command -v ccache >/dev/null 2>&1 || { echo 0 0; return; }
  ccache --print-stats 2>/dev/null | awk '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { h += $2 }
    $1 == "cache_miss" { m += $2 }
    END { print h + 0, m + 0 }'
}

# The main build: tests on, whatever was configured before.
main_build() {
  step "build ($build)"
  local t0=$SECONDS h0 m0 h1 m1
  read -r h0 m0 < <(ccache_counts)
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DBUILD_TESTING=ON -DMATMUL_WERROR=ON -DMATMUL_SANITIZE= -DMATMUL_FUZZ=OFF >/dev/null &&
    cmake --build "$build" -j "$jobs"
  local rc=$?
  read -r h1 m1 < <(ccache_counts)
  local hits=$((h1 - h0)) compiles=$((h1 - h0 + m1 - m0))
  build_note="main build: $((SECONDS - t0)) s, $compiles compiles through ccache, $hits hits"
  ((compiles > 0)) && build_note+=" ($((100 * hits / compiles))%)"
  echo "$build_note"
  if ((rc != 0)); then
    row build 0 1 0 $((SECONDS - t0)) "build failed"
    finish
  fi
  # Every test belongs to one suite, or this script would not run it.
  local stray
  stray=$(ctest --test-dir "$build" -N -LE '^(unit|integration|python|e2e|deploy|gpu|lint)$' |
    sed -n 's/^Total Tests: //p')
  if [[ $stray != 0 ]]; then
    echo "tests with no suite label (tests/CMakeLists.txt lists the labels):"
    ctest --test-dir "$build" -N -LE '^(unit|integration|python|e2e|deploy|gpu|lint)$'
    row labels 0 "$stray" 0 0 "tests with no suite label"
  fi
}

if [[ $mode == quick ]]; then
  main_build
  for suite in unit integration python; do ctest_suite "$suite" "$build"; done
  finish
fi

step "dependencies"
scripts/install-deps.sh || { row dependencies 0 1 0 0 "install-deps.sh failed"; finish; }

main_build
for suite in unit integration python e2e deploy; do ctest_suite "$suite" "$build"; done
if [[ $(ctest --test-dir "$build" -N -L '^gpu$' | sed -n 's/^Total Tests: //p') != 0 ]]; then
  ctest_suite gpu "$build"
else
  row gpu 0 0 0 0 "CUDA engine not built (no nvcc)"
fi

step "install: the C++ client installed and used by examples/ (scripts/check_install.sh)"
t0=$SECONDS
install_log=$results/check-install.log
MATMUL_SERVER=$root/$build/bin/matmul-server scripts/check_install.sh 2>&1 | tee "$install_log"
install_rc=${PIPESTATUS[0]}
read -r ipassed ifailed < <(sed -n 's/^check_install: \([0-9]*\) passed, \([0-9]*\) failed/\1 \2/p' "$install_log")
ipassed=${ipassed:-0} ifailed=${ifailed:-0}
((install_rc != 0 && ifailed == 0)) && ifailed=1
row install $((ipassed + ifailed)) "$ifailed" 0 $((SECONDS - t0)) "check_install.sh steps: client-only build, install, consumer, multiply"

step "lint: buf lint (proto/), clang-format, shellcheck, include cycles, function length, proto compatibility"
t0=$SECONDS
files=$(git ls-files '*.cc' '*.h' | grep -v '^third_party/')
nfiles=$(wc -w <<<"$files")
nproto=$(git ls-files 'proto/*.proto' | grep -vc '^proto/released/')
# Every tracked shell script: the *.sh files and the executables whose first
# line runs sh or bash (.ci/run).
scripts=$({
  git ls-files '*.sh'
  git ls-files -s | awk '$1 == "100755"' | cut -f2 | while read -r f; do
    head -n 1 "$f" 2>/dev/null | grep -qE '^#!.*[/ ](ba)?sh([[:space:]]|$)' && echo "$f"
  done
} | grep -v '^third_party/' | sort -u)
nscripts=$(wc -w <<<"$scripts")
lint_failed=0
(cd proto && ../tools/node_modules/.bin/buf lint) || lint_failed=$((lint_failed + 1))
# shellcheck disable=SC2086
clang-format --dry-run --Werror $files || lint_failed=$((lint_failed + 1))
# shellcheck disable=SC2086
shellcheck -x $scripts || lint_failed=$((lint_failed + 1))
# No include cycles between units (a .h with its .cc), and no function in
# server/ or gpu/ longer than 120 lines (issue 56).
"$py" scripts/check_include_cycles.py --units server client common tools bench || lint_failed=$((lint_failed + 1))
"$py" scripts/check_include_cycles.py --units gpu || lint_failed=$((lint_failed + 1))
"$py" scripts/check_function_length.py server gpu || lint_failed=$((lint_failed + 1))
# The protobuf API against its last release, and the lint checkers' own cases.
lint_junit=$results/ctest-lint.xml lint_since=$(date +%s)
ctest --test-dir "$build" -L '^lint$' --no-tests=error --output-on-failure \
  --output-junit "$lint_junit" || lint_failed=$((lint_failed + 1))
read -r nlint _ < <("$py" "$summary_py" count "$lint_junit" --pytest-dir "$results" --since "$lint_since")
row lint $((nfiles + nproto + nscripts + 3 + nlint)) "$lint_failed" 0 $((SECONDS - t0)) "files: $nproto proto (buf), $nfiles C++ (clang-format), $nscripts shell (shellcheck); 2 include-cycle checks, 1 function-length check; $nlint ctest -L lint (proto compatibility, checkers' own tests)"

step "warnings: clang-14, -Wthread-safety -Werror (scripts/warnings.sh)"
t0=$SECONDS
warnings_log=$results/warnings.log
scripts/warnings.sh 2>&1 | tee "$warnings_log" | grep -E 'error|warning|^warnings:'
warnings_rc=${PIPESTATUS[0]}
units=$(sed -n 's/^warnings: \([0-9]*\) translation units.*/\1/p' "$warnings_log")
row warnings "${units:-0}" $((warnings_rc != 0)) 0 $((SECONDS - t0)) "translation units built by clang with warnings as errors"

step "deployment manifests (scripts/check-deploy.sh)"
t0=$SECONDS
deploy_log=$results/check-deploy.log
scripts/check-deploy.sh 2>&1 | tee "$deploy_log"
deploy_rc=${PIPESTATUS[0]}
read -r dpassed dfailed < <(sed -n 's/^check-deploy: \([0-9]*\) passed, \([0-9]*\) failed/\1 \2/p' "$deploy_log")
dpassed=${dpassed:-0} dfailed=${dfailed:-0}
((deploy_rc != 0 && dfailed == 0)) && dfailed=1
row manifests $((dpassed + dfailed)) "$dfailed" 0 $((SECONDS - t0)) "check-deploy.sh steps"

step "sanitizers: ASan+UBSan (scripts/sanitize.sh asan)"
t0=$SECONDS
asan_dir=${ASAN_BUILD_DIR:-build-asan}
asan_since=$(date +%s)
scripts/sanitize.sh asan
asan_rc=$?
read -r run failed skipped < <("$py" "$summary_py" count "$root/$asan_dir/test-results/ctest.xml" \
  --pytest-dir "$root/$asan_dir/test-results" --since "$asan_since")
((asan_rc != 0 && failed == 0)) && failed=1
row asan+ubsan "$run" "$failed" "$skipped" $((SECONDS - t0)) "every ctest suite; build included"

step "sanitizers: TSan (scripts/sanitize.sh tsan)"
t0=$SECONDS
tsan_dir=${TSAN_BUILD_DIR:-build-tsan}
scripts/sanitize.sh tsan
tsan_rc=$?
read -r run failed skipped < <("$py" "$summary_py" count "$root/$tsan_dir"/test-results/tsan-*.xml)
((tsan_rc != 0 && failed == 0)) && failed=1
row tsan "$run" "$failed" "$skipped" $((SECONDS - t0)) "gtest binaries without in-process gRPC; build included"

fuzz_seconds=${FUZZ_SECONDS:-60}
step "fuzzing: request parsing and validation, $fuzz_seconds s (scripts/fuzz.sh)"
t0=$SECONDS
fuzz_dir=${FUZZ_BUILD_DIR:-build-fuzz}
mkdir -p "$fuzz_dir"
fuzz_log=$root/$fuzz_dir/fuzz.log
scripts/fuzz.sh "$fuzz_seconds" >"$fuzz_log" 2>&1
fuzz_rc=$?
if ((fuzz_rc == 0)); then
  # The build lines and libFuzzer's progress are kept in the log; the
  # summary is what a reader needs.
  grep -E '^fuzz:|^stat::|^Done [0-9]+ runs' "$fuzz_log"
  echo "(full log: $fuzz_log)"
else
  tail -n 120 "$fuzz_log"
fi
runs=$("$py" "$summary_py" fuzz "$fuzz_log")
row fuzz "$runs" $((fuzz_rc != 0)) 0 $((SECONDS - t0)) "inputs executed by request_fuzzer; build included"

finish
