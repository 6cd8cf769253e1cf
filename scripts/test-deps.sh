#!/usr/bin/env bash
# test-deps: prepare what the test suite needs outside Go, before `go test`.
# Called by `make test` (target test-deps); add new set-up steps here.
#
# - Redis: the Redis store's tests (internal/redistest and the packages that
#   use it) start their own redis-server, Cluster and Sentinel processes on
#   free loopback ports. ensure-redis.sh makes sure the binaries are on PATH,
#   installing them with apt-get when they are missing and we are root, and
#   otherwise fails saying what to install.
# - Chromium: the browser tests (caddytest/browser_test.go) open the
#   simulator's HTML report and the admin API's live page in headless
#   Chromium; ensure-chromium.sh installs Debian's package the same way.
# - Prometheus: observability/ runs promtool on the alert rules and
#   caddytest/prometheus_test.go starts a real Prometheus scraping Caddy;
#   ensure-prometheus.sh installs Debian's package (it ships promtool).
# - curl and jq: caddytest/docs_test.go runs the manual's console blocks,
#   which use them; installed the same way.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

bash "$here/ensure-redis.sh" </dev/null
bash "$here/ensure-chromium.sh" </dev/null
bash "$here/ensure-prometheus.sh" </dev/null

for b in curl jq; do
	command -v "$b" >/dev/null 2>&1 && continue
	if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
		echo "test-deps: missing $b (the manual's console blocks use it); install it and run this again" >&2
		exit 1
	fi
	echo "test-deps: missing $b; installing it with apt-get" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$b" >/dev/null ||
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$b" >/dev/null; }
done
