#!/bin/sh
# Prints what the Makefile stamps into internal/version:
#   version.sh version   the tag without its v (git describe --tags --match 'v[0-9]*':
#                        'v*' would take a tag such as validated-candidate),
#                        a pre-release's - as ~ (v1.2.0-rc1 -> 1.2.0~rc1), with
#                        +N.gHASH past it; with no tag 0.0.0~gitYYYYMMDDhhmmss.HASH
#                        (the commit's date and time, UTC); +dirty with
#                        uncommitted changes
#   version.sh commit    the full commit hash
#   version.sh date      SOURCE_DATE_EPOCH, else the commit's committer date,
#                        RFC 3339 in UTC
# Nothing here reads the clock: the same commit builds the same bytes.
#
# Every form sorts as dpkg and apt sort versions (dpkg --compare-versions):
# ~ sorts before anything, so a snapshot 0.0.0~git... is older than any
# 0.0.0 or later release, and snapshots sort by their commit's time, to
# the second (a date alone would sort two of one day by hash). A
# pre-release tag's - becomes ~ so that 1.2.0~rc1 < 1.2.0, as semver has
# it; kept, 1.2.0-rc1 would be 1.2.0 with packaging revision rc1, after
# 1.2.0. The markers after a version use +, which
# sorts after the version it follows: 1.2.3 < 1.2.3+4.gHASH < 1.2.4, and a
# dirty build sorts after the clean build of its commit. git describe's
# own - (1.2.3-4-gHASH, -dirty) would not do: in a Debian version the last
# - starts the packaging revision, so a packager's own -1 would make
# -dirty part of the upstream version and the revision meaningless.
set -eu

stamp() { # epoch format
	date -u -d "@$1" "+$2" 2>/dev/null || date -u -r "$1" "+$2"
}

case "${1:-}" in
version)
	if ! git rev-parse --verify -q HEAD >/dev/null 2>&1; then
		echo dev # not a checkout with a commit: internal/version's default
		exit 0
	fi
	dirty=
	if ! git diff --quiet HEAD -- 2>/dev/null; then
		dirty=+dirty
	fi
	if v=$(git describe --tags --match 'v[0-9]*' 2>/dev/null); then
		# v1.2.3 -> 1.2.3; v1.2.3-4-gabc1234 -> 1.2.3+4.gabc1234;
		# v1.2.3-rc.1-4-gabc1234 -> 1.2.3~rc.1+4.gabc1234 (no - is left:
		# a pre-release's first becomes ~, any later one .)
		echo "$v" | sed -e 's/^v//' -e 's/-\([0-9][0-9]*\)-\(g[0-9a-f]*\)$/+\1.\2/' \
			-e 's/-/~/' -e 's/-/./g' -e "s/\$/$dirty/"
	else
		echo "0.0.0~git$(stamp "$(git log -1 --format=%ct)" %Y%m%d%H%M%S).$(git rev-parse --short=12 HEAD)$dirty"
	fi
	;;
commit)
	git rev-parse HEAD 2>/dev/null || echo unknown
	;;
date)
	epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || true)}
	if [ -z "$epoch" ]; then
		echo unknown
	else
		stamp "$epoch" %Y-%m-%dT%H:%M:%SZ
	fi
	;;
*)
	echo "usage: $0 version|commit|date" >&2
	exit 2
	;;
esac
