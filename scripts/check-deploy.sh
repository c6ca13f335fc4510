#!/usr/bin/env bash
# Checks the container and Kubernetes deployment offline (no cluster, no
# container engine); CI runs it. Idempotent; about 15 s.
#
#   1. Dockerfile     dockerfile-utils lint (any finding fails), then
#                     deploy/check-dockerfile.mjs (pinned CUDA images,
#                     install-deps.sh, numeric USER, ENTRYPOINT, ports,
#                     COPY sources vs .dockerignore), and
#                     scripts/build-image.sh --dry-run for both targets
#   2. render         kustomize: deploy/base and every deploy/overlays/*
#   3. manifests      deploy/validate.mjs: kubernetes-models schemas,
#                     unknown fields, deployment policy, adapter rules,
#                     PrometheusRule in sync with deploy/prometheus/
#   4. rules          promtool check rules on each PrometheusRule's groups
#                     and on the autoscaling queries
#   5. queries        promtool test rules tests/deploy/scaling_queries_test.yml
#   6. unit tests     node --test tests/deploy/
#
# Rendering uses `kubectl kustomize` (kubectl >= 1.27 embeds kustomize v5),
# or a standalone `kustomize build` when there is no kubectl.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
# step NAME COMMAND...: runs COMMAND with its output kept aside; prints it
# only when the step fails.
step() {
  local name=$1
  shift
  if "$@" >"$work/step.log" 2>&1; then
    echo "ok   $name"
    passed=$((passed + 1))
  else
    sed 's/^/     /' "$work/step.log"
    echo "FAIL $name"
    failed=$((failed + 1))
  fi
}

# Node tools, pinned by tools/package-lock.json (scripts/install-deps.sh
# installs them; this only repairs a missing or stale tools/node_modules).
if ! (cd tools && npm ls --silent >/dev/null 2>&1); then
  (cd tools && npm ci --no-audit --no-fund --loglevel=error)
fi
bin=tools/node_modules/.bin

if command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1; then
  render() { kubectl kustomize "$1"; }
elif command -v kustomize >/dev/null 2>&1; then
  render() { kustomize build "$1"; }
else
  echo "check-deploy: needs kubectl (>= 1.27) or kustomize (v5) to render deploy/" >&2
  exit 2
fi

# 1. Dockerfile. dockerfile-utils exits 0 on warnings: any output fails.
lint_dockerfile() {
  local out
  out=$("$bin/dockerfile-utils" lint Dockerfile 2>&1) || { echo "$out"; return 1; }
  [ -z "$out" ] || { echo "$out"; return 1; }
}
step "Dockerfile lint (dockerfile-utils)" lint_dockerfile
step "Dockerfile policy" node deploy/check-dockerfile.mjs
# The build commands and the manifest edit, printed, not run (no container
# engine here); a tree with local changes gets a -dirty tag.
dry_build() {
  scripts/build-image.sh --dry-run --allow-dirty &&
    scripts/build-image.sh --dry-run --allow-dirty --target cpu
}
step "build-image.sh --dry-run (cuda, cpu)" dry_build

# 2. Render.
overlays=(deploy/base deploy/overlays/*/)
render_all() {
  local dir name
  for dir in "${overlays[@]}"; do
    name=$(basename "$dir")
    render "$dir" >"$work/$name.yaml" || { echo "render $dir failed"; return 1; }
  done
}
step "render ${#overlays[@]} kustomizations" render_all

# 3. Manifests. Its per-overlay lines are worth seeing even when all pass.
extras=()
for f in deploy/nvidia-device-plugin/*.yaml; do extras+=(--extra "$f"); done
rendered=("$work"/*.yaml)
if node deploy/validate.mjs --out "$work" "${extras[@]}" "${rendered[@]}" >"$work/validate.log" 2>&1; then
  sed 's/^/     /' "$work/validate.log"
  echo "ok   manifests (schemas, fields, policy)"
  passed=$((passed + 1))
else
  sed 's/^/     /' "$work/validate.log"
  echo "FAIL manifests (schemas, fields, policy)"
  failed=$((failed + 1))
fi

# 4, 5. Prometheus rules and the autoscaling queries.
if ls "$work"/rules-*.yml >/dev/null 2>&1; then
  step "promtool check rules (PrometheusRule, scaling queries)" \
    promtool check rules "$work"/rules-*.yml "$work/scaling-queries.rules.yml"
  cp tests/deploy/scaling_queries_test.yml "$work/"
  step "promtool test rules (HPA and KEDA queries agree)" \
    promtool test rules "$work/scaling_queries_test.yml"
else
  echo "FAIL promtool: validate.mjs wrote no rule files"
  failed=$((failed + 1))
fi

# 6. Unit tests of the checkers themselves.
step "node --test tests/deploy" node --test tests/deploy/

echo "check-deploy: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
