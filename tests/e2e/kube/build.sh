#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and etcd from the Go module
# proxy into a cache directory outside the repository, keyed by version.
# Idempotent: when every binary is already there it prints nothing and exits.
#
#   tests/e2e/kube/build.sh              build what is missing
#   tests/e2e/kube/build.sh --print-dir  print the binary directory and exit
#
# BATCHPILOT_KUBE_CACHE overrides the cache root
# (default: ${XDG_CACHE_HOME:-$HOME/.cache}/batchpilot/kube).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"

cache_root="${BATCHPILOT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchpilot/kube}"
bin_dir="$cache_root/${KUBE_VERSION}-etcd-${ETCD_VERSION}"

if [ "${1:-}" = "--print-dir" ]; then
    echo "$bin_dir"
    exit 0
fi

binaries=(kube-apiserver kube-controller-manager etcd)
missing=()
for b in "${binaries[@]}"; do
    [ -x "$bin_dir/$b" ] || missing+=("$b")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

command -v go >/dev/null || { echo "build.sh: 'go' is not on PATH; Go >= 1.26 is needed to build the e2e control plane" >&2; exit 1; }

export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -buildvcs=false -mod=mod"
# Only the module proxy: a fallback to version-control hosts ("direct") would
# download from outside the package registries.
GOPROXY="$(go env GOPROXY)"
GOPROXY="${GOPROXY%,direct}"
GOPROXY="${GOPROXY%|direct}"
case "$GOPROXY" in
    direct | off | "") echo "build.sh: GOPROXY must name a module proxy (it is '$GOPROXY')" >&2; exit 1 ;;
esac
export GOPROXY

mkdir -p "$bin_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

now() { date +%s; }
log() { echo "build.sh: $*" >&2; }

# A wrapper module per upstream module keeps their dependency graphs apart
# (etcd's server and Kubernetes pin different versions of shared libraries).
build_kube() {
    local mod="$work/kubernetes" minor gomod
    mkdir -p "$mod"
    cp "$here/kubernetes/go.mod" "$here/kubernetes/go.sum" "$mod/" 2>/dev/null || true
    cd "$mod"
    if [ ! -f go.mod ]; then
        go mod init batchpilot.test/e2e/kubernetes >/dev/null 2>&1
        go mod edit -go=1.26.0  # not the local toolchain's patch release
    fi

    # k8s.io/kubernetes lists its staging modules at v0.0.0 and replaces them
    # with directories inside its own tree; a consumer must replace each one
    # with the published release. Read the list from the module's own go.mod
    # so a new staging module is never missed.
    gomod="$(go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [ -n "$gomod" ] || { log "could not read the go.mod of k8s.io/kubernetes@${KUBE_VERSION}"; exit 1; }
    local staging_version="v0.${KUBE_VERSION#v1.}"
    local edits=(-require="k8s.io/kubernetes@${KUBE_VERSION}")
    while read -r path; do
        edits+=(-replace="${path}=${path}@${staging_version}")
    done < <(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u)
    go mod edit "${edits[@]}"
    # each at the pinned version: a bare `go get` would take the latest release
    local tools=("k8s.io/kubernetes/cmd/kube-apiserver@${KUBE_VERSION}" "k8s.io/kubernetes/cmd/kube-controller-manager@${KUBE_VERSION}")
    go get -tool "${tools[@]}" >/dev/null 2>&1 || go get -tool "${tools[@]}"
    go mod tidy >/dev/null 2>&1 || go mod tidy

    minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
    local pkgs ldflags="-s -w"
    for pkgs in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X ${pkgs}.gitVersion=${KUBE_VERSION}"
        ldflags+=" -X ${pkgs}.gitMajor=1 -X ${pkgs}.gitMinor=${minor}"
        ldflags+=" -X ${pkgs}.gitTreeState=clean"
        ldflags+=" -X ${pkgs}.buildDate=1970-01-01T00:00:00Z"
    done
    for b in kube-apiserver kube-controller-manager; do
        local t0; t0=$(now)
        nice go build -trimpath -ldflags "$ldflags" -o "$bin_dir/$b.tmp" "k8s.io/kubernetes/cmd/$b"
        mv "$bin_dir/$b.tmp" "$bin_dir/$b"
        log "built $b ${KUBE_VERSION} in $(( $(now) - t0 ))s"
    done
    # Keep the resolved module files next to the sources so a review sees
    # exactly which versions the binaries come from.
    cp go.mod go.sum "$here/kubernetes/" 2>/dev/null || true
}

build_etcd() {
    local mod="$work/etcd"
    mkdir -p "$mod"
    cp "$here/etcd/go.mod" "$here/etcd/go.sum" "$mod/" 2>/dev/null || true
    cd "$mod"
    if [ ! -f go.mod ]; then
        go mod init batchpilot.test/e2e/etcd >/dev/null 2>&1
        go mod edit -go=1.26.0
    fi
    # etcd's server module replaces its sibling modules with relative paths;
    # outside its tree they resolve to the releases of the same tag.
    go mod edit -require="go.etcd.io/etcd/server/v3@${ETCD_VERSION}" \
        -replace="go.etcd.io/etcd/api/v3=go.etcd.io/etcd/api/v3@${ETCD_VERSION}" \
        -replace="go.etcd.io/etcd/client/pkg/v3=go.etcd.io/etcd/client/pkg/v3@${ETCD_VERSION}" \
        -replace="go.etcd.io/etcd/client/v3=go.etcd.io/etcd/client/v3@${ETCD_VERSION}" \
        -replace="go.etcd.io/etcd/pkg/v3=go.etcd.io/etcd/pkg/v3@${ETCD_VERSION}"
    go get -tool "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >/dev/null 2>&1 || go get -tool "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
    go mod tidy >/dev/null 2>&1 || go mod tidy
    local t0; t0=$(now)
    nice go build -trimpath -ldflags "-s -w" -o "$bin_dir/etcd.tmp" go.etcd.io/etcd/server/v3
    mv "$bin_dir/etcd.tmp" "$bin_dir/etcd"
    log "built etcd ${ETCD_VERSION} in $(( $(now) - t0 ))s"
    cp go.mod go.sum "$here/etcd/" 2>/dev/null || true
}

start=$(now)
log "building ${missing[*]} into $bin_dir (first run only; takes a while)"
need_kube=0
for b in "${missing[@]}"; do
    case "$b" in kube-*) need_kube=1 ;; esac
done
mkdir -p "$here/kubernetes" "$here/etcd"
if [ "$need_kube" -eq 1 ]; then build_kube; fi
if [[ " ${missing[*]} " == *" etcd "* ]]; then build_etcd; fi
log "control plane ready in $(( $(now) - start ))s"
