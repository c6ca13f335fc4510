#!/usr/bin/env bash
# Builds the matmul-server image from the Dockerfile, tags it
# <image>:<version>-<commit> (the CMake project version and the checked-out
# commit), and writes that reference into deploy/base/kustomization.yaml
# (images: name matmul), so that the manifests run what was built.
#
#   scripts/build-image.sh [options]
#     --target cuda|cpu     cuda (default): the GPU image; cpu: the host
#                           engine on Debian, tag suffix -cpu (the manifests
#                           run GPU pods, so they are left alone)
#     --cuda-version X.Y.Z  build on another CUDA release (13.0.x, or 12.5+
#                           for drivers older than 580); tag suffix -cudaX.Y.Z
#     --image NAME          repository to tag (default matmul-server), e.g.
#                           registry.example.com/ml/matmul-server
#     --push                push the tag, then pin the manifests to the
#                           pushed digest (newTag and digest)
#     --no-manifest         leave deploy/base/kustomization.yaml alone
#     --manifest-only       only write the manifest for this commit (the
#                           image was built elsewhere, e.g. by CI)
#     --allow-dirty         build from a tree with uncommitted changes
#                           (tag suffix -dirty; the manifests are left alone)
#     --dry-run             print the commands and the manifest edit; run
#                           and change nothing (needs no docker)
#
# The manifest edit is what `kustomize edit set image matmul=NAME:TAG` (or
# matmul=NAME:TAG@sha256:...) makes, done in place so that the file's
# comments stay. Changes under deploy/ do not count as dirty: the build
# context leaves deploy/ out (.dockerignore), so committing the edited
# manifest after the build changes nothing in the image.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
die() { echo "build-image: $*" >&2; exit 2; }

target=cuda
cuda_version=""
image=matmul-server
push=0
manifest=1
manifest_only=0
allow_dirty=0
dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --target) [ $# -ge 2 ] || usage; target=$2; shift 2 ;;
    --cuda-version) [ $# -ge 2 ] || usage; cuda_version=$2; shift 2 ;;
    --image) [ $# -ge 2 ] || usage; image=$2; shift 2 ;;
    --push) push=1; shift ;;
    --no-manifest) manifest=0; shift ;;
    --manifest-only) manifest_only=1; shift ;;
    --allow-dirty) allow_dirty=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage ;;
    *) echo "build-image: unknown argument: $1" >&2; usage ;;
  esac
done

case "$target" in
  cuda|cpu) ;;
  *) die "--target must be cuda or cpu, not '$target'" ;;
esac
grep -Eq "^FROM .* AS ${target}\$" Dockerfile || die "the Dockerfile has no stage named $target"

default_cuda=$(sed -n 's/^ARG CUDA_VERSION=\(.*\)$/\1/p' Dockerfile)
[ -n "$default_cuda" ] || die "the Dockerfile has no ARG CUDA_VERSION=..."
if [ -n "$cuda_version" ]; then
  [ "$target" = cuda ] || die "--cuda-version applies to --target cuda only"
  # 13.0.x, or a CUDA 12 release with ubuntu24.04 images and GCC 13 support.
  [[ $cuda_version =~ ^(13\.0|12\.([5-9]|[1-9][0-9]))\.[0-9]+$ ]] ||
    die "--cuda-version $cuda_version: want 13.0.x or 12.N.x with N >= 5 (e.g. 12.9.1)"
  [ "$cuda_version" != "$default_cuda" ] || cuda_version=""
fi

# A repository reference: lower-case path components, an optional
# registry host (with port) first; no tag or digest (this script adds them).
[[ $image =~ ^([a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*$ ]] ||
  die "--image '$image' is not a repository name (lower case, no tag or digest)"

version=$(sed -n 's/^project(matmul VERSION \([0-9][0-9.]*\).*/\1/p' CMakeLists.txt)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "no project(matmul VERSION x.y.z) in CMakeLists.txt"
commit=$(git rev-parse --short=12 HEAD 2>/dev/null) || die "not a git checkout"
revision=$(git rev-parse HEAD)
dirty=$(git status --porcelain --untracked-files=no -- . ':(exclude)deploy')

tag="$version-$commit"
[ "$target" = cpu ] && tag+="-cpu"
[ -n "$cuda_version" ] && tag+="-cuda$cuda_version"
if [ -n "$dirty" ]; then
  [ "$allow_dirty" = 1 ] || die "uncommitted changes outside deploy/ (commit them, or --allow-dirty):
$dirty"
  tag+="-dirty"
fi
ref="$image:$tag"

# What the manifests get: only a clean CUDA build of the default release.
write_manifest=$manifest
reason=""
if [ "$target" != cuda ]; then write_manifest=0; reason="the manifests run the cuda target"
elif [ -n "$cuda_version" ]; then write_manifest=0; reason="the manifests follow the default CUDA release; set images: in an overlay"
elif [ -n "$dirty" ]; then write_manifest=0; reason="a -dirty tag names no commit"
fi
if [ "$manifest_only" = 1 ] && [ "$write_manifest" = 0 ]; then
  die "--manifest-only: nothing to write (${reason:---no-manifest})"
fi

# run COMMAND...: prints it, shell-quoted; runs it unless --dry-run.
run() {
  printf '+'; printf ' %q' "$@"; printf '\n'
  [ "$dry_run" = 1 ] || "$@"
}

if [ "$manifest_only" = 0 ]; then
  if [ "$dry_run" = 0 ]; then
    command -v docker >/dev/null 2>&1 || die "docker is not installed (--dry-run prints the commands)"
  fi
  # RUN --mount (the ccache cache) needs BuildKit.
  build=(env DOCKER_BUILDKIT=1 docker build --file Dockerfile --target "$target")
  [ -n "$cuda_version" ] && build+=(--build-arg "CUDA_VERSION=$cuda_version")
  build+=(--build-arg "IMAGE_VERSION=$version"
          --build-arg "GIT_COMMIT=${revision:0:12}"
          --label "org.opencontainers.image.version=$version"
          --label "org.opencontainers.image.revision=$revision"
          --tag "$ref" .)
  run "${build[@]}"
  [ "$push" = 1 ] && run docker push "$ref"
fi

digest=""
if [ "$push" = 1 ] && [ "$manifest_only" = 0 ]; then
  if [ "$dry_run" = 1 ]; then
    digest="sha256:<the digest docker push reports>"
    echo "+ docker inspect --format '{{index .RepoDigests 0}}' $ref"
  else
    repo_digest=$(docker inspect --format '{{index .RepoDigests 0}}' "$ref")
    digest=${repo_digest#*@}
    [[ $digest =~ ^sha256:[0-9a-f]{64}$ ]] || die "no digest for $ref after the push: $repo_digest"
  fi
fi

kustomization=deploy/base/kustomization.yaml
if [ "$write_manifest" = 0 ]; then
  echo "build-image: $ref${reason:+ ($reason)}; $kustomization left alone"
  exit 0
fi

# The images: entry for name matmul, rewritten: newName, newTag and (after a
# push) digest; every other line of the file is kept.
edit_manifest() {
  awk -v name="$image" -v tag="$tag" -v digest="$digest" '
    function emit() {
      print "    newName: " name
      print "    newTag: " tag
      if (digest != "") print "    digest: " digest
      done = 1
    }
    /^images:/ { in_images = 1; print; next }
    in_images && /^[^ #]/ { if (in_item) emit(); in_images = 0; in_item = 0 }
    in_images && /^  - / {
      if (in_item) emit()
      in_item = ($0 ~ /^  - name: matmul[ \t]*$/)
      print; next
    }
    in_item && /^    (newName|newTag|digest):/ { next }
    { print }
    END { if (in_item) emit(); if (!done) exit 3 }
  ' "$1"
}
new=$(mktemp)
trap 'rm -f "$new"' EXIT
edit_manifest "$kustomization" >"$new" || die "$kustomization has no images: entry '- name: matmul'"
if [ "$dry_run" = 1 ]; then
  echo "build-image: would write $ref${digest:+@$digest} into $kustomization:"
  diff -u "$kustomization" "$new" | sed -n '3,$p' || true
else
  cat "$new" >"$kustomization"
  echo "build-image: $ref${digest:+@$digest} written into $kustomization (commit it)"
fi
