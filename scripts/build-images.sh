#!/usr/bin/env bash
# Build the rallypoint container image (and, when needed, a local base image).
#
#   scripts/build-images.sh              # rallypoint:local (+ rallypoint:<version>)
#   BASE_IMAGE=python:3.11-slim scripts/build-images.sh
#
# Steps, each cached so that a second run does little:
#   1. base image: BASE_IMAGE if given; else python:3.11-slim when it is present
#      or can be pulled; else (and always when CI=true) a local Debian bookworm
#      image built with debootstrap and `docker import`, skipped when it exists.
#   2. wheels: rallypoint itself plus every dependency as binary wheels for the
#      image's Python (PY_VERSION), in dist/wheels; dependencies are fetched
#      again only when pyproject.toml changes.
#   3. the image, from docker/Dockerfile with --build-arg BASE_IMAGE.
#
# Environment:
#   IMAGE            tag to build (default rallypoint:local)
#   BASE_IMAGE       base to build on (default: decided as above)
#   LOCAL_BASE       tag of the local base image (default rallypoint-base:bookworm)
#   DEBIAN_MIRROR    mirror for debootstrap (default: read from apt's sources)
#   PY_VERSION       Python of the base image (default 3.11)
#   PULL_TIMEOUT_S   how long a pull of the upstream base may take (default 30)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGE="${IMAGE:-rallypoint:local}"
LOCAL_BASE="${LOCAL_BASE:-rallypoint-base:bookworm}"
UPSTREAM_BASE="python:3.11-slim"
PY_VERSION="${PY_VERSION:-3.11}"
PULL_TIMEOUT_S="${PULL_TIMEOUT_S:-30}"
WHEELS="$ROOT/dist/wheels"
PYTHON="${PYTHON:-python3}"

log() { printf 'build-images: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# Debian's engine (API 1.41) is driven with Debian's client when both exist:
# a newer client on PATH would negotiate down, but its `build` wants buildx.
if [[ -x /usr/bin/docker ]]; then DOCKER=/usr/bin/docker; else DOCKER="$(command -v docker)"; fi
[[ -n "$DOCKER" ]] || die "docker not found; run scripts/setup-system.sh (as root) first"
"$DOCKER" info >/dev/null 2>&1 || die "docker engine not reachable; run scripts/setup-system.sh"
export DOCKER_BUILDKIT=0

image_exists() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# Mirror from apt's own sources (deb822 "URIs:" or one-line "deb URL bookworm main").
debian_mirror() {
    if [[ -n "${DEBIAN_MIRROR:-}" ]]; then echo "$DEBIAN_MIRROR"; return; fi
    local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
    local url
    url="$(cat "${files[@]}" 2>/dev/null | awk '
        /^[[:space:]]*#/ { next }
        $1 == "URIs:" { for (i = 2; i <= NF; i++) print $i; next }
        $1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) { print $i; break } }
    ' | grep -E '/debian/?$' | head -n1)"
    echo "${url:-http://deb.debian.org/debian}"
}

build_local_base() {
    if image_exists "$LOCAL_BASE"; then
        log "base $LOCAL_BASE exists; skipping debootstrap"
        return
    fi
    command -v debootstrap >/dev/null || die "debootstrap missing; run scripts/setup-system.sh"
    local mirror rootfs started=$SECONDS
    mirror="$(debian_mirror)"
    rootfs="$(mktemp -d /tmp/rallypoint-rootfs.XXXXXX)"
    # shellcheck disable=SC2064  # expand now: the trap must remove this directory
    trap "rm -rf '$rootfs'" EXIT
    log "debootstrap bookworm from $mirror into $rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv bookworm "$rootfs" "$mirror" \
        >"$rootfs.log" 2>&1 || { tail -n 30 "$rootfs.log" >&2; die "debootstrap failed"; }
    rm -f "$rootfs.log"
    # Caches, docs and translations are dead weight in an image that never runs apt
    # (the locale catalogues alone are a fifth of the image).
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/usr/share/locale/*/ "$rootfs"/var/log/* "$rootfs"/tmp/*
    tar -C "$rootfs" -c . | "$DOCKER" import \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
    rm -rf "$rootfs"
    trap - EXIT
    log "built $LOCAL_BASE in $((SECONDS - started))s"
}

choose_base() {
    if [[ -n "${BASE_IMAGE:-}" ]]; then echo "$BASE_IMAGE"; return; fi
    if [[ "${CI:-}" != "true" ]]; then
        if image_exists "$UPSTREAM_BASE" \
            || timeout "$PULL_TIMEOUT_S" "$DOCKER" pull -q "$UPSTREAM_BASE" >/dev/null 2>&1; then
            echo "$UPSTREAM_BASE"
            return
        fi
        log "cannot pull $UPSTREAM_BASE; building a local base instead"
    fi
    build_local_base
    echo "$LOCAL_BASE"
}

build_wheels() {
    local started=$SECONDS arch stamp want
    mkdir -p "$WHEELS"
    rm -f "$WHEELS"/rallypoint-*.whl
    # Build from a clean copy: setuptools' build/ directory in the tree can hold
    # modules deleted since, and the copy leaves the tree untouched. A fixed
    # SOURCE_DATE_EPOCH makes the wheel reproducible, so that Docker's layer
    # cache holds while the sources do not change.
    local src
    src="$(mktemp -d /tmp/rallypoint-src.XXXXXX)"
    tar -C "$ROOT" -c --exclude=__pycache__ --exclude='*.egg-info' pyproject.toml README.md src \
        | tar -C "$src" -x
    SOURCE_DATE_EPOCH=315532800 "$PYTHON" -m pip wheel --quiet --no-deps --wheel-dir "$WHEELS" \
        "$src" >/dev/null
    rm -rf "$src"
    local wheel
    wheel="$(ls "$WHEELS"/rallypoint-*.whl)"
    # Dependencies as binary wheels for the image's interpreter, not the host's:
    # the image has no compiler and reaches no index.
    arch="$(uname -m)"
    stamp="$WHEELS/.deps-stamp"
    want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-64) py$PY_VERSION $arch"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        log "dependency wheels up to date"
    else
        "$PYTHON" -m pip download --quiet --dest "$WHEELS" --only-binary=:all: \
            --python-version "$PY_VERSION" --implementation cp \
            --platform "manylinux_2_36_$arch" --platform "manylinux_2_28_$arch" \
            --platform "manylinux_2_17_$arch" --platform "manylinux2014_$arch" \
            --platform "manylinux1_$arch" --platform any \
            "$wheel" 2> >(grep -v "is neither a file nor a directory" >&2)
        echo "$want" >"$stamp"
    fi
    log "wheels ready in $((SECONDS - started))s: $(find "$WHEELS" -name '*.whl' | wc -l) files"
}

main() {
    local base started=$SECONDS version
    base="$(choose_base)"
    build_wheels
    version="$("$PYTHON" -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$ROOT/pyproject.toml")"
    log "building $IMAGE on $base"
    # A minimal context (the paths the Dockerfile copies), whatever else lies in the tree.
    tar -C "$ROOT" -c docker/Dockerfile docker/trainer.py dist/wheels \
        | "$DOCKER" build --quiet -f docker/Dockerfile --build-arg "BASE_IMAGE=$base" \
            -t "$IMAGE" -t "rallypoint:$version" - >/dev/null
    log "built $IMAGE in $((SECONDS - started))s, $("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" \
        | awk '{printf "%.1f MB", $1 / 1e6}')"
}

main "$@"
