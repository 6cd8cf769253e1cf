#!/usr/bin/env bash
# ensure-chromium.sh: make sure a Chromium is on PATH for the browser tests
# (caddytest/browser_test.go: the simulator's HTML report and the admin
# API's live page in headless Chromium), installing Debian's package with
# apt-get when it is missing and we are root. Fails loudly otherwise: the
# tests never skip for want of a browser.
set -euo pipefail

for b in chromium chromium-browser google-chrome; do
	if command -v "$b" >/dev/null 2>&1; then
		printf '%s: %s\n' "$b" "$("$b" --version 2>/dev/null | head -n1)"
		exit 0
	fi
done

if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
	cat >&2 <<MSG
ensure-chromium: no Chromium on PATH.
The browser tests open pages in headless Chromium. Install it, for example:
    sudo apt-get install chromium          (Debian)
    sudo apt-get install chromium-browser  (Ubuntu)
then run this script again. (It installs it itself only when run as root on
a system with apt-get.)
MSG
	exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "ensure-chromium: installing chromium with apt-get" >&2
log=$(mktemp -t ensure-chromium.XXXXXX)
trap 'rm -f "$log"' EXIT
install() { apt-get install -y -q --no-install-recommends chromium; }
if ! install >"$log" 2>&1; then
	echo "ensure-chromium: install failed without a package list update; running apt-get update" >&2
	apt-get update -q >"$log" 2>&1 || { cat "$log" >&2; echo "ensure-chromium: apt-get update failed" >&2; exit 1; }
	if ! install >"$log" 2>&1; then
		tail -n 30 "$log" >&2
		echo "ensure-chromium: apt-get install chromium failed" >&2
		exit 1
	fi
fi
if ! command -v chromium >/dev/null 2>&1; then
	echo "ensure-chromium: chromium still not on PATH after install" >&2
	exit 1
fi
printf 'chromium: %s\n' "$(chromium --version 2>/dev/null | head -n1)"
