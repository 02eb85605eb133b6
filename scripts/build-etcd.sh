#!/usr/bin/env bash
# Builds a pinned etcd server and etcdctl from the Go module proxy into .tools/bin.
# A throwaway module is needed: `go install go.etcd.io/etcd/server/v3@...` refuses
# because of the replace directives in etcd's own go.mod.
set -euo pipefail
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/.tools/bin"
stamp="$bin/.etcd-$ETCD_VERSION"
if [ -x "$bin/etcd" ] && [ -x "$bin/etcdctl" ] && [ -f "$stamp" ]; then
  exit 0
fi
src="$root/.tools/etcd-src"
rm -rf "$src"
mkdir -p "$src" "$bin"
cd "$src"
go mod init etcdbin >/dev/null 2>&1
go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION"
go build -trimpath -o "$bin/etcd" go.etcd.io/etcd/server/v3
go build -trimpath -o "$bin/etcdctl" go.etcd.io/etcd/etcdctl/v3
rm -f "$bin"/.etcd-*
touch "$stamp"
echo "built etcd $ETCD_VERSION into $bin"
