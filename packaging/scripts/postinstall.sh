#!/bin/sh
# After an install or an upgrade (deb: postinst configure; rpm: %post).
# systemd reads the shipped units afresh, so that `systemctl enable` finds
# them and the next start of a running unit uses the new file. Nothing is
# enabled, started or restarted: which units a master runs depends on its
# kind (docs/operations.md, docs/kubeadm.md), and a fleet-wide upgrade must
# not restart every master's confd or signer at once; the operator restarts
# them one master at a time.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
exit 0
