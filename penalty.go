package sluice

import (
	"time"
)

// penaltyControl: once the zone refuses a key, the key stays refused for
// `penalty <duration>`, whatever its bucket would allow sooner
// (algorithms/penalty.go). It travels in the zone's limit (Limit.Penalty),
// kept by the stores with the key's state in the one Store.Take, so it joins no
// stage of the request. Its value is checked and compiled into the limit by
// the zone model (zonemodel.Zone.Limit), which the simulator reads too.
var penaltyControl = control{
	name: "penalty",
	admin: func(z *zone, info *adminZoneInfo) {
		if z.limit.Penalty > 0 {
			info.Penalty = (time.Duration(z.limit.Penalty) * time.Millisecond).String()
		}
	},
}
