#!/bin/sh
# After the package's files are gone (deb: postrm; rpm: %postun): systemd
# forgets the removed units. Nothing else: /etc/confd and /etc/kubernetes
# are the site's, and the package never wrote them.
set -e
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
exit 0
