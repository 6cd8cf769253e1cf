#!/usr/bin/env bash
# xcaddy-check: build Caddy with this plugin the way users do (xcaddy), then
# check that the binary lists Sluice's modules and adapts Caddyfile.example.
#
# Usage: scripts/xcaddy-check.sh          (from anywhere; `make xcaddy-check`)
#
# Environment:
#   XCADDY_VERSION   xcaddy to install when missing (default v0.4.5)
#   CADDY_VERSION    Caddy version to build (default v2.11.9, as in go.mod)
set -euo pipefail

XCADDY_VERSION="${XCADDY_VERSION:-v0.4.5}"
CADDY_VERSION="${CADDY_VERSION:-v2.11.9}"
MODULE="github.com/sluicehq/caddy-sluice"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gobin="$(go env GOPATH)/bin"
export PATH="$PATH:$gobin"

if ! command -v xcaddy >/dev/null 2>&1; then
	echo "xcaddy-check: installing xcaddy ${XCADDY_VERSION}"
	go install "github.com/caddyserver/xcaddy/cmd/xcaddy@${XCADDY_VERSION}"
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/sluice-xcaddy.XXXXXX")"
cleanup() { chmod -R u+w "$tmp" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT

# The module proxy answers 403 for module paths it has never seen (such as
# this unpublished one, even though xcaddy replaces it with the local
# directory), and a 403 stops Go's ",direct" fallback. "|off" lets any
# refusal fall through to "off", so the local replacement is used. Users on
# the public internet need none of this.
proxy="$(go env GOPROXY | cut -d, -f1)"
proxy="${proxy%%|*}"
case "$proxy" in
"" | off | direct) xproxy="$(go env GOPROXY)" ;;
*) xproxy="${proxy}|off" ;;
esac

echo "xcaddy-check: xcaddy build ${CADDY_VERSION} --with ${MODULE}=${repo} (GOPROXY=${xproxy})"
start=$(date +%s)
(
	cd "$tmp"
	GOPROXY="$xproxy" xcaddy build "$CADDY_VERSION" \
		--with "${MODULE}=${repo}" \
		--output "$tmp/caddy"
)
echo "xcaddy-check: built in $(($(date +%s) - start))s"

modules="$("$tmp/caddy" list-modules)"
fail=0
for id in http.handlers.rate_limit http.handlers.rate_limit.stores.memory http.handlers.rate_limit.stores.redis admin.api.rate_limit http.handlers.rate_limit_ui; do
	if grep -qxF "$id" <<<"$modules"; then
		echo "xcaddy-check: module $id: ok"
	else
		echo "xcaddy-check: module $id missing from 'caddy list-modules'" >&2
		fail=1
	fi
done
if [ "$fail" -ne 0 ]; then
	exit 1
fi

"$tmp/caddy" adapt --config "$repo/Caddyfile.example" >"$tmp/adapted.json"
if ! grep -q '"handler":"rate_limit"' "$tmp/adapted.json"; then
	echo "xcaddy-check: 'caddy adapt' output has no rate_limit handler" >&2
	exit 1
fi
echo "xcaddy-check: caddy adapt --config Caddyfile.example: ok"
echo "xcaddy-check: passed"
