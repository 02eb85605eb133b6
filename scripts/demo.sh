#!/usr/bin/env bash
# The main job, end to end on loopback: start a real etcd, publish three
# masters' service-account public keys, render the example resources with
# bin/confd (bundle + kube-apiserver flag file, checked by
# kube-apiserver-safe-restart check), then show that a published private key
# is refused and the live bundle stays as it was.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/bin"
tools="${ETCD_BIN_DIR:-$root/.tools/etcd-3.6.16}"
work="$(mktemp -d)"
etcd_pid=""
cleanup() {
  rc=$?
  if [ -n "$etcd_pid" ]; then kill "$etcd_pid" 2>/dev/null; wait "$etcd_pid" 2>/dev/null || true; fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT

free_port() {
  local p
  while :; do
    p=$(( (RANDOM % 20000) + 30000 ))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
client=$(free_port); peer=$(free_port)
endpoint="http://127.0.0.1:$client"

echo "== starting etcd on $endpoint"
"$tools/etcd" --name demo --data-dir "$work/etcd" \
  --listen-client-urls "$endpoint" --advertise-client-urls "$endpoint" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "demo=http://127.0.0.1:$peer" --heartbeat-interval=10 --election-timeout=100 \
  --log-level error >"$work/etcd.log" 2>&1 &
etcd_pid=$!
etcdctl() { "$tools/etcdctl" --endpoints "$endpoint" "$@"; }
for _ in $(seq 100); do etcdctl endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
etcdctl endpoint health

echo "== publishing three masters' public keys (what each master's publisher unit does)"
for m in master-1 master-2 master-3 master-4; do
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$work/$m.key" 2>/dev/null
  openssl pkey -in "$work/$m.key" -pubout -out "$work/$m.pub"
  [ "$m" = master-4 ] && continue
  etcdctl put "/kubernetes/service-account-keys/$m" < "$work/$m.pub" >/dev/null
  echo "   put /kubernetes/service-account-keys/$m"
done

echo "== laying out the example confdir with destinations under $work/out"
mkdir -p "$work/out/pki"
# This host is master-1: its own signing key sits beside the bundle.
cp "$work/master-1.key" "$work/out/pki/sa.key"
cp -r "$root/examples/confd" "$work/confd"
sed -i "s#/etc/kubernetes/#$work/out/#g" "$work"/confd/templates/*
for f in "$work"/confd/conf.d/*.toml; do
  sed -i -e "s#/etc/kubernetes/#$work/out/#g" \
         -e "s#/usr/local/bin/kube-apiserver-safe-restart#$bin/kube-apiserver-safe-restart#g" \
         -e '/^owner/d' \
         -e 's#^reload_cmd .*#reload_cmd = "echo [demo] would now run kube-apiserver-safe-restart for {{.dest}}"#' "$f"
done

# confd.toml as an operator writes it, pointing at the demo etcd.
cat > "$work/confd/confd.toml" <<TOML
backend = "etcdv3"
nodes   = ["$endpoint"]
confdir = "$work/confd"
TOML
# /etc/kubernetes/safe-restart.toml as the bundle's check_cmd reads it: the
# etcd that holds the trust records (none yet here: no apiserver restarted).
cat > "$work/out/safe-restart.toml" <<TOML
endpoints = ["$endpoint"]
TOML
confd() { "$bin/confd" -config-file "$work/confd/confd.toml" "$@"; }

echo "== confd -onetime"
confd -onetime
echo "--- $work/out/pki/sa-bundle.pem ($(stat -c %a "$work/out/pki/sa-bundle.pem")):"
grep -cE "BEGIN PUBLIC KEY" "$work/out/pki/sa-bundle.pem" | sed "s/^/   public keys in the bundle: /"
echo "--- $work/out/apiserver-sa.env:"
cat "$work/out/apiserver-sa.env"

echo "== a fourth master publishes a PRIVATE key by mistake: the check refuses it"
etcdctl put /kubernetes/service-account-keys/master-4 < "$work/master-4.key" >/dev/null
before=$(sha256sum "$work/out/pki/sa-bundle.pem")
if confd -onetime 2>"$work/refused.log"; then
  echo "unexpected: confd accepted a private key" >&2; exit 1
fi
grep -m1 -E 'check_cmd failed|must never be published' "$work/refused.log" | sed 's/^.*ERROR /   ERROR /'
[ "$before" = "$(sha256sum "$work/out/pki/sa-bundle.pem")" ] && echo "   live bundle unchanged"

echo "== the key is corrected; -noop shows what would change"
etcdctl put /kubernetes/service-account-keys/master-4 < "$work/master-4.pub" >/dev/null
confd -onetime -noop 2>/dev/null | grep -E '^(\+\+\+|---|@@|\+-----)' || true
echo "== demo done"
