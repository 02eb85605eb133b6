#!/bin/sh
# Before the package is removed (deb: prerm remove; rpm: %preun with $1 = 0),
# not before an upgrade (deb: upgrade; rpm: $1 = 1): stops and disables each
# unit a master may have enabled from this package, so that none is left to
# run a binary that is gone. sa-signing-key.service is a kubeadm master's
# copy of the example; the kube-apiserver.service.d drop-ins are the site's
# copies, left in place (kube-apiserver.service is the site's).
# sa-key-publish.path is no longer shipped (sa-key-publish.service watches
# the key files itself); a master installed before may still have it
# enabled.
set -e
case "${1:-}" in
remove | 0) ;;
*) exit 0 ;;
esac
if [ -d /run/systemd/system ]; then
	for u in confd.service sa-key-publish.path sa-key-publish.service sa-key-retire.timer sa-key-retire.service \
		kube-apiserver-sa-signer.service kube-apiserver-safe-restart.service sa-signing-key.service; do
		systemctl --no-reload disable --now "$u" >/dev/null 2>&1 || :
	done
fi
exit 0
