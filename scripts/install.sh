#!/bin/sh
# Installs the three binaries, one kind of master's systemd units and every
# example, arming nothing; `make install` and the packages (`make dist`)
# both run it, so that a package holds what `make install` installs.
#
# Settings, from the environment (the Makefile passes its variables):
#   KIND        binary (default: kube-apiserver as a systemd unit) or
#               kubeadm (kube-apiserver as a static pod): whose units go to
#               SYSTEMDDIR
#   BIN         the directory holding the three built binaries (bin)
#   DESTDIR     staging root (empty)
#   PREFIX      /usr/local; the binaries go to PREFIX/bin
#   SYSTEMDDIR  /etc/systemd/system
#   DOCDIR      PREFIX/share/doc/keysync
#
# What goes where, and why nothing is armed:
#   - the KIND's units to SYSTEMDDIR. A unit file runs only once enabled
#     (or started): the enable steps are the site's (docs/operations.md,
#     docs/kubeadm.md). The other kind's units are not installed there:
#     both kinds have a confd.service, and each has units the other must
#     not run (kube-apiserver-safe-restart.service restarts a
#     kube-apiserver.service a kubeadm master does not have).
#   - every example, both kinds' units and the kube-apiserver.service.d
#     drop-ins included, under DOCDIR/examples, to be copied: a drop-in
#     anywhere on systemd's unit path applies at the next daemon-reload,
#     enabled or not, so none is ever installed there.
#   - README.md, LICENSE and docs/ to DOCDIR, so that the examples' and the
#     docs' relative links hold there.
#   - nothing to /etc/confd or /etc/kubernetes: the site's, never written.
# Every /usr/local/bin/ in an installed unit or example names PREFIX/bin/,
# where the binaries are. examples/puppet is not installed: it is a Puppet
# module's source, whose class installs the binaries itself.
set -eu
# The modes below are the installed ones, whatever the caller's umask.
umask 022

KIND=${KIND:-binary}
BIN=${BIN:-bin}
DESTDIR=${DESTDIR:-}
PREFIX=${PREFIX:-/usr/local}
SYSTEMDDIR=${SYSTEMDDIR:-/etc/systemd/system}
DOCDIR=${DOCDIR:-$PREFIX/share/doc/keysync}

# The units each kind runs from the unit path. Both kinds share the
# publisher, the retirement timer and the signer.
shared="examples/systemd/sa-key-publish.service
examples/systemd/sa-key-retire.service examples/systemd/sa-key-retire.timer
examples/systemd/kube-apiserver-sa-signer.service"
case "$KIND" in
binary)
	units="$shared examples/systemd/confd.service examples/systemd/kube-apiserver-safe-restart.service"
	;;
kubeadm)
	units="$shared examples/kubeadm/systemd/confd.service examples/kubeadm/systemd/sa-signing-key.service"
	;;
*)
	echo "install.sh: KIND=$KIND: want KIND=binary (kube-apiserver as a systemd unit) or KIND=kubeadm (a static pod)" >&2
	exit 2
	;;
esac

for b in confd kube-apiserver-safe-restart kube-apiserver-sa-signer; do
	if [ ! -x "$BIN/$b" ]; then
		echo "install.sh: no executable $BIN/$b: run make build first (or set BIN to the directory holding the three binaries)" >&2
		exit 1
	fi
done

# copy SRC DEST: SRC with its /usr/local/bin/ paths at PREFIX/bin/, mode
# 0644, replaced whole (never a half-written unit on the unit path).
copy() {
	install -d "$(dirname "$2")"
	sed "s|/usr/local/bin/|$PREFIX/bin/|g" "$1" >"$2.tmp"
	chmod 0644 "$2.tmp"
	mv "$2.tmp" "$2"
}

install -d "$DESTDIR$PREFIX/bin" "$DESTDIR$SYSTEMDDIR"
install -m 0755 "$BIN/confd" "$BIN/kube-apiserver-safe-restart" "$BIN/kube-apiserver-sa-signer" "$DESTDIR$PREFIX/bin/"
for u in $units; do
	copy "$u" "$DESTDIR$SYSTEMDDIR/${u##*/}"
done
for f in $(find examples -type f ! -path 'examples/puppet/*' | LC_ALL=C sort); do
	copy "$f" "$DESTDIR$DOCDIR/$f"
done
install -d "$DESTDIR$DOCDIR/docs"
install -m 0644 README.md LICENSE "$DESTDIR$DOCDIR/"
install -m 0644 docs/*.md "$DESTDIR$DOCDIR/docs/"
