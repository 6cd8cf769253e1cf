#!/usr/bin/env bash
# ensure-redis.sh: make sure redis-server, redis-cli and redis-sentinel are on
# PATH, installing them with apt-get when they are missing and we are root.
#
# The tests (internal/redistest) start their own servers on free loopback
# ports; they never use a system Redis. Debian's packages start a system
# service on port 6379 (and a sentinel on 26379) right after install, so this
# script stops and disables those services again.
#
# Exit status: 0 when all three binaries are available, 1 otherwise.
set -euo pipefail

BINARIES=(redis-server redis-cli redis-sentinel)
PACKAGES=(redis-server redis-sentinel redis-tools)

have_all() {
	local b
	for b in "${BINARIES[@]}"; do
		command -v "$b" >/dev/null 2>&1 || return 1
	done
}

print_versions() {
	local b
	for b in "${BINARIES[@]}"; do
		printf '%s: %s\n' "$b" "$("$b" --version 2>&1 | head -n1)"
	done
}

stop_services() {
	local svc
	for svc in redis-server redis-sentinel; do
		service "$svc" stop >/dev/null 2>&1 || true
		systemctl disable --now "$svc" >/dev/null 2>&1 || true
	done
	# No init system in a container: the postinst may still have left a
	# daemon behind. Only stop the packaged daemons (their pid files), never
	# servers started by the tests.
	local pidfile pid
	for pidfile in /run/redis/redis-server.pid /run/sentinel/redis-sentinel.pid \
		/var/run/redis/redis-server.pid /var/run/sentinel/redis-sentinel.pid; do
		if [[ -r "$pidfile" ]]; then
			pid=$(cat "$pidfile" 2>/dev/null || true)
			if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
				kill "$pid" 2>/dev/null || true
			fi
		fi
	done
}

if have_all; then
	print_versions
	exit 0
fi

missing=()
for b in "${BINARIES[@]}"; do
	command -v "$b" >/dev/null 2>&1 || missing+=("$b")
done

if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
	cat >&2 <<MSG
ensure-redis: missing ${missing[*]}.
The tests start real Redis servers and need redis-server, redis-cli and
redis-sentinel on PATH (Redis 7.0 or newer). Install them, for example:
    sudo apt-get install redis-server redis-sentinel redis-tools   (Debian/Ubuntu)
    brew install redis                                             (macOS)
then run this script again. (It installs them itself only when run as root
on a system with apt-get.)
MSG
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "ensure-redis: missing ${missing[*]}; installing ${PACKAGES[*]} with apt-get" >&2

log=$(mktemp -t ensure-redis.XXXXXX)
trap 'rm -f "$log"' EXIT

install() {
	apt-get install -y -q --no-install-recommends "${PACKAGES[@]}"
}

if ! install >"$log" 2>&1; then
	echo "ensure-redis: install failed without a package list update; running apt-get update" >&2
	apt-get update -q >"$log" 2>&1 || {
		cat "$log" >&2
		echo "ensure-redis: apt-get update failed" >&2
		exit 1
	}
	if ! install >"$log" 2>&1; then
		tail -n 30 "$log" >&2
		echo "ensure-redis: apt-get install ${PACKAGES[*]} failed" >&2
		exit 1
	fi
fi

stop_services

if ! have_all; then
	for b in "${BINARIES[@]}"; do
		command -v "$b" >/dev/null 2>&1 || echo "ensure-redis: $b still not on PATH after install" >&2
	done
	exit 1
fi
print_versions
