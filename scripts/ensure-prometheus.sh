#!/usr/bin/env bash
# ensure-prometheus.sh: make sure prometheus and promtool are on PATH,
# installing Debian's prometheus package with apt-get when they are missing
# and we are root.
#
# The tests (observability/ and caddytest/prometheus_test.go) run promtool
# on the alert rules and start their own Prometheus on a free loopback port;
# they never use a system Prometheus. Debian's package starts a service on
# port 9090 after install where an init system runs, so this script stops
# and disables it again.
#
# Exit status: 0 when both binaries are available, 1 otherwise.
set -euo pipefail

BINARIES=(prometheus promtool)

have_all() {
	local b
	for b in "${BINARIES[@]}"; do
		command -v "$b" >/dev/null 2>&1 || return 1
	done
}

if have_all; then
	printf 'prometheus: %s\n' "$(prometheus --version 2>&1 | head -n1)"
	exit 0
fi

if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
	cat >&2 <<MSG
ensure-prometheus: missing prometheus or promtool.
The tests run promtool on observability/sluice-alerts.yml and start a real
Prometheus. Install them, for example:
    sudo apt-get install prometheus     (Debian/Ubuntu: ships promtool)
    brew install prometheus             (macOS)
then run this script again. (It installs them itself only when run as root
on a system with apt-get.)
MSG
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "ensure-prometheus: missing prometheus or promtool; installing prometheus with apt-get" >&2

log=$(mktemp -t ensure-prometheus.XXXXXX)
trap 'rm -f "$log"' EXIT

install() {
	apt-get install -y -q --no-install-recommends prometheus
}

if ! install >"$log" 2>&1; then
	echo "ensure-prometheus: install failed without a package list update; running apt-get update" >&2
	apt-get update -q >"$log" 2>&1 || {
		cat "$log" >&2
		echo "ensure-prometheus: apt-get update failed" >&2
		exit 1
	}
	if ! install >"$log" 2>&1; then
		tail -n 30 "$log" >&2
		echo "ensure-prometheus: apt-get install prometheus failed" >&2
		exit 1
	fi
fi

service prometheus stop >/dev/null 2>&1 || true
systemctl disable --now prometheus >/dev/null 2>&1 || true

if ! have_all; then
	echo "ensure-prometheus: prometheus or promtool still not on PATH after install" >&2
	exit 1
fi
printf 'prometheus: %s\n' "$(prometheus --version 2>&1 | head -n1)"
