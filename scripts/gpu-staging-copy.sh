#!/usr/bin/env bash
# One device call on the staging copy (server/staging_copier.h,
# bench/LOG.md section 20): staging_copy_bench by helper count (512
# KiB one every 400 us and back to back, 8 MiB one every 2 ms), with and
# without announcing each copy 10 us ahead (ExpectCopy), then the service
# targets (scripts/gpu-targets.sh, ROUNDS and PAIRS passed through, default
# 1 and 3) for SERVERS, by default the default server against
# --staging-copy-expect-spin-us=100 (whether ExpectCopy should be on by
# default) and against --staging-copy-threads=0. The machine's usable cores
# head the summary: the default helper count is a quarter of them.
# First the GPU tests (see TESTS below), then matmul-bench --verify at
# n=256 and n=1024 against the default server (3 helpers on 16 cores): the
# products with the helpers on.
# Expects staging_copy_bench, matmul-server, matmul-bench, rawecho and
# rawclient in .gpubundle (and the tests named below, each skipped when
# not bundled); writes summary.txt, targets.txt and the outputs
# into OUT.
#
#   [SERVERS="a b"] [ROUNDS=1] [PAIRS=3] [TESTS=0] scripts/gpu-staging-copy.sh OUT
set -u
out=${1:?usage: gpu-staging-copy.sh OUT}
logfile=summary.txt
mkdir -p "$out"
# shellcheck source=scripts/gpu-common.sh
. "$(dirname "$0")/gpu-common.sh"

log_gpu
log "cores: nproc $(nproc), cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo none)"
# The GPU tests of what changed since the last GPU run (TESTS=0 skips
# them): those bundled of the shared-memory path, the copier, the server
# and the streamed multiply on the CUDA engine, and job_graph_test without
# its AllShapes sweep (its fault cases came after the sweep in a cut run).
if [ "${TESTS:-1}" != 0 ]; then
  for t in cuda_shared_memory_test staging_copier_test job_graph_test \
    server_test multiply_stream_test; do
    [ "$R" != .gpubundle/run ] || [ -x ".gpubundle/bin/$t" ] || continue
    filter='*'
    [ "$t" = job_graph_test ] && filter='-AllShapes/*'
    MATMUL_TEST_ENGINE=cuda timeout 200 "$R" "$t" --gtest_filter="$filter" \
      >"$out/$t.log" 2>&1
    log "$t rc=$? $(gtest_summary "$out/$t.log")"
  done
fi
for lead in -1 10; do
  for point in "--bytes 524288 --gap-us 400 --copies 2000" \
    "--bytes 524288 --gap-us 0 --copies 2000" \
    "--bytes 8388608 --gap-us 2000 --copies 500 --buffers 16"; do
    # shellcheck disable=SC2086 # the point's arguments split on purpose
    timeout 120 $R staging_copy_bench $point --expect-lead-us "$lead" \
      >>"$out/$logfile" 2>&1
  done
done
# Products checked against the client's float64 reference with the
# helpers on (every 4th response), before the timed points.
start_server "$out/server-verify.log" --metrics-port 9464
for point in "256 8 4" "1024 2 2"; do
  # shellcheck disable=SC2086 # N C CH
  set -- $point
  timeout 60 "$R" matmul-bench --target $T --shape "$1" --concurrency "$2" \
    --channels "$3" --duration 2 --warmup 0.5 --timeout 30 --verify \
    --verify-every 4 >"$out/verify-n$1.txt" 2>&1
  log "verify n=$1 c=$2: matmul-bench exit $? (3: a wrong product)"
done
log "$(stage_means "after the verify points")"
stop_server
SERVERS=${SERVERS:-"matmul-server matmul-server:--staging-copy-expect-spin-us=100 matmul-server:--staging-copy-threads=0"} \
  ROUNDS=${ROUNDS:-1} PAIRS=${PAIRS:-3} \
  "$(dirname "$0")/gpu-targets.sh" "$out"
