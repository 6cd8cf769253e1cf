package sluice

import (
	"fmt"

	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// A zone's configuration, its defaults and its checks live in zonemodel,
// which `caddy rate-limit simulate` reads too; the handler's runtime zone
// (compile.go) is built from zonemodel.Compiled.

// Zone is one zone's configuration (Handler.RateLimits): zonemodel.Zone.
type Zone = zonemodel.Zone

// LocalAllowance is a zone's local allowance (Zone.LocalAllowance).
type LocalAllowance = zonemodel.LocalAllowance

// KeyCandidates is a zone's key candidates (Zone.Key).
type KeyCandidates = zonemodel.KeyCandidates

// Fail policies, and the longest zone name.
const (
	failOpenPolicy   = zonemodel.FailOpen
	failClosedPolicy = zonemodel.FailClosed
	failLocalPolicy  = zonemodel.FailLocal
	maxZoneNameLen   = zonemodel.MaxNameLen
)

// zoneErr names the zone in err: quoted (a name may hold spaces or quotes),
// and cut short if it is too long to be a name.
func zoneErr(name string, err error) error {
	if len(name) > maxZoneNameLen {
		return fmt.Errorf("zone %.40q...: %w", name, err)
	}
	return fmt.Errorf("zone %q: %w", name, err)
}

// Settle is a zone's settle source (Zone.Settle).
type Settle = zonemodel.Settle
