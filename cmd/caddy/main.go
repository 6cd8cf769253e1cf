// Command caddy is stock Caddy with the Sluice rate_limit plugin, for
// `go run ./cmd/caddy run --config Caddyfile.example` and the tests.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// The rate_limit directive and its stores.
	_ "github.com/sluicehq/caddy-sluice"
)

func main() {
	caddycmd.Main()
}
