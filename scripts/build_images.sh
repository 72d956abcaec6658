#!/usr/bin/env bash
# Build Sluice's images with buildah: `make image` (see deploy/images/README.md).
#
#   IMAGES        which to build: "gateway" (default), "vllm", "trtllm" (space-separated)
#   IMAGE_BASE    the gateway image's Debian base [localhost/debian:bookworm, made here from Debian's
#                 packages by mmdebstrap when missing]; elsewhere pass debian:bookworm-slim
#   VLLM_BASE     the upstream vLLM image (vllm/vllm-openai:<tag>), TRTLLM_BASE the NGC TensorRT-LLM one
#   TORCH_WHEELS  a directory holding the torch 2.13.0+cpu wheel [/opt/wheels when it has one];
#                 without it torch comes from PyTorch's CPU index
#   IMAGE_TAG     [the version in pyproject.toml]
#   FORCE=1       rebuild even when the image of the same sources exists (its label org.sluice.sources)
# Storage is vfs and the build runs with chroot isolation and the host's network, which work on
# these machines (../shared/ENVIRONMENT.md, "Containers"). Prints each image's build time and size.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
images=${IMAGES:-gateway}
base=${IMAGE_BASE:-localhost/debian:bookworm}
tag=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)}
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
storage=(--storage-driver vfs)
wheels=${TORCH_WHEELS-/opt/wheels}

exists() { podman "${storage[@]}" image exists "$1"; }

debian_base() {  # localhost/debian:bookworm from Debian's packages (no registry needed), once
  exists "$base" && return 0
  mkdir -p "$cache/image"
  local tar="$cache/image/debian-bookworm-minbase.tar"
  if [ ! -s "$tar" ]; then
    echo ">> mmdebstrap --variant=minbase bookworm ($tar)"
    mmdebstrap --quiet --variant=minbase bookworm "$tar.tmp" && mv "$tar.tmp" "$tar"
  fi
  podman "${storage[@]}" import --quiet "$tar" "$base" >/dev/null
}

# No --layers: under vfs every cached step is a full copy of the image (a build with it left
# 10-20 GB behind); without it a build keeps only the image. A failed build may leave a working
# container holding its layers: `buildah --storage-driver vfs containers` lists them.
common=(--isolation chroot --network host)
# A proxy that re-signs TLS needs its CA inside the build too (pip verifies PyPI with it).
cert=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [ -n "$cert" ] && [ -f "$cert" ]; then
  common+=(-v "$cert:/run/build-ca.crt:ro" --build-arg PIP_BUILD_CERT=/run/build-ca.crt)
fi

sources() {  # a digest of what goes into an image: the build context's files (tracked or new) and the arguments
  { git ls-files -z --cached --others --exclude-standard -- pyproject.toml README.md requirements-runtime.txt \
      .containerignore deploy/images gateway engines router model_repository \
      | sort -z | xargs -0 sha256sum 2>/dev/null; echo "$*"; } | sha256sum | cut -c1-16
}

build() {  # name containerfile image-tag extra-args...; skipped when the image of these sources exists
  local name=$1 file=$2 ref=$3; shift 3
  local t0=$SECONDS digest
  digest=$(sources "$file" "$@")
  if [ -z "${FORCE:-}" ] && [ "$(podman "${storage[@]}" image inspect --format \
      '{{index .Labels "org.sluice.sources"}}' "$ref" 2>/dev/null)" = "$digest" ]; then
    echo ">> $name: $ref is up to date (sources $digest; FORCE=1 rebuilds)"
    return 0
  fi
  echo ">> building $ref ($file)"
  buildah "${storage[@]}" bud "${common[@]}" --label "org.sluice.sources=$digest" -f "$file" -t "$ref" "$@" .
  local size
  size=$(podman "${storage[@]}" image inspect --format '{{.Size}}' "$ref")
  echo ">> $name: $ref built in $((SECONDS - t0)) s, $((size / 1000000)) MB"
  podman "${storage[@]}" image prune --force >/dev/null  # the previous build of this tag, now untagged
}

for image in $images; do
  case $image in
    gateway)
      [[ $base == localhost/debian:* ]] && debian_base
      torch=()
      if [ -n "$wheels" ] && compgen -G "$wheels/torch-2.13.0+cpu-*.whl" >/dev/null; then
        torch=(-v "$wheels:/wheels:ro" --build-arg TORCH_FIND_LINKS=/wheels)
      fi
      build gateway deploy/images/gateway.Containerfile "localhost/sluice:$tag" \
        --build-arg "BASE=$base" "${torch[@]}"
      ;;
    vllm)
      : "${VLLM_BASE:?set VLLM_BASE to an upstream vLLM image, e.g. vllm/vllm-openai:v0.11.0}"
      build vllm deploy/images/vllm.Containerfile "localhost/sluice-vllm:$tag" --build-arg "VLLM_BASE=$VLLM_BASE"
      ;;
    trtllm)
      : "${TRTLLM_BASE:?set TRTLLM_BASE to an NGC TensorRT-LLM image, e.g. nvcr.io/nvidia/tensorrt-llm/release:<tag>}"
      build trtllm deploy/images/trtllm.Containerfile "localhost/sluice-trtllm:$tag" \
        --build-arg "TRTLLM_BASE=$TRTLLM_BASE"
      ;;
    *) echo "unknown image $image (gateway, vllm, trtllm)" >&2; exit 2 ;;
  esac
done
