#!/usr/bin/env bash
# Builds a pinned kube-apiserver (or, with KUBE_CMD=kube-controller-manager,
# the controller-manager: `make kube-controller-manager`) from the Go module
# proxy into .tools/bin, for the fleet rehearsal. `go install` cannot do it: k8s.io/kubernetes replaces its
# k8s.io/* staging modules with ./staging paths, so a throwaway module requires
# k8s.io/kubernetes and points every staging module (required at v0.0.0) at its
# published v0.X.Y instead. Cold: ~6 min and ~3 GB of memory on 2 cores; a
# re-link with a warm Go cache takes seconds. Cached by version like etcd.
set -euo pipefail
KUBE_VERSION="${KUBE_VERSION:-v1.37.2}"
KUBE_CMD="${KUBE_CMD:-kube-apiserver}"
case "$KUBE_CMD" in
kube-apiserver | kube-controller-manager) ;;
*) echo "KUBE_CMD=$KUBE_CMD: want kube-apiserver or kube-controller-manager" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.tools/bin"
stamp="$bin/.$KUBE_CMD-$KUBE_VERSION"
if [ -x "$bin/$KUBE_CMD" ] && [ -f "$stamp" ]; then
  exit 0
fi
staging="v0.${KUBE_VERSION#v1.}" # v1.37.2 -> v0.37.2
src="$root/.tools/kube-apiserver-src"
rm -rf "$src"
mkdir -p "$src" "$bin"
cd "$src"
go mod init kubeapiserverbin >/dev/null 2>&1
go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null
gomod="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBE_VERSION.mod"
# Every k8s.io module that k8s.io/kubernetes requires at exactly v0.0.0 is a staging module.
mods=$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u)
[ -n "$mods" ] || { echo "no staging modules found in $gomod" >&2; exit 1; }
{
  echo "require k8s.io/kubernetes $KUBE_VERSION"
  for m in $mods; do echo "replace $m => $m $staging"; done
} >>go.mod
minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}" # v1.37.2 -> 37
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$bin/$KUBE_CMD" "k8s.io/kubernetes/cmd/$KUBE_CMD"
rm -f "$bin/.$KUBE_CMD-"*
touch "$stamp"
echo "built $KUBE_CMD $KUBE_VERSION into $bin"
