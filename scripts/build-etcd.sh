#!/usr/bin/env bash
# Builds pinned etcd servers, etcdctl and etcdutl (the snapshot restore
# tool from 3.5 on) from the Go module proxy, each
# version into a directory of its own, .tools/etcd-VERSION/ (VERSION without
# the leading v). A throwaway module per version is needed: `go install
# go.etcd.io/etcd/server/v3@...` refuses because of the replace directives in
# etcd's own go.mod. etcd 3.4 cannot be built this way (its module has no /v3
# path); tests take it from Debian's package (docs/development.md).
#
# Usage: build-etcd.sh [VERSION...]   (default: $ETCD_VERSIONS, else 3.6.16)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
  read -r -a versions <<<"${ETCD_VERSIONS:-3.6.16}"
fi
for v in "${versions[@]}"; do
  v="${v#v}"
  dir="$root/.tools/etcd-$v"
  if [ -x "$dir/etcd" ] && [ -x "$dir/etcdctl" ] && [ -x "$dir/etcdutl" ] && [ -f "$dir/.built" ]; then
    continue
  fi
  src="$root/.tools/etcd-src-$v"
  rm -rf "$src" "$dir"
  mkdir -p "$src" "$dir"
  (
    cd "$src"
    go mod init etcdbin >/dev/null 2>&1
    go get "go.etcd.io/etcd/server/v3@v$v" "go.etcd.io/etcd/etcdctl/v3@v$v" "go.etcd.io/etcd/etcdutl/v3@v$v"
    go build -trimpath -o "$dir/etcd" go.etcd.io/etcd/server/v3
    go build -trimpath -o "$dir/etcdctl" go.etcd.io/etcd/etcdctl/v3
    go build -trimpath -o "$dir/etcdutl" go.etcd.io/etcd/etcdutl/v3
  )
  rm -rf "$src"
  touch "$dir/.built"
  echo "built etcd $v into $dir"
done
