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
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

bash "$here/ensure-redis.sh" </dev/null
bash "$here/ensure-chromium.sh" </dev/null
