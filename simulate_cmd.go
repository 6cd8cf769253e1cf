package sluice

import (
	// `caddy rate-limit simulate` (caddycmd.RegisterCommand in the
	// package's init) and its guest modules: every build with the plugin
	// has the command.
	_ "github.com/sluicehq/caddy-sluice/simulate"
)
