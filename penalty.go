package sluice

import (
	"fmt"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// penaltyControl: once the zone refuses a key, the key stays refused for
// `penalty <duration>`, whatever its bucket would allow sooner
// (algorithms/penalty.go). It travels in the zone's limit (Limit.Penalty),
// kept by the stores with the key's state in the one take, so it joins no
// stage of the request.
var penaltyControl = control{
	name: "penalty",
	compile: func(z *zone, cfg *Zone) (err error) {
		z.limit.Penalty, err = cfg.penalty()
		return err
	},
	admin: func(z *zone, info *adminZoneInfo) {
		if z.limit.Penalty > 0 {
			info.Penalty = (time.Duration(z.limit.Penalty) * time.Millisecond).String()
		}
	},
}

// penalty returns the zone's penalty in milliseconds (0: none), checked.
func (z *Zone) penalty() (int64, error) {
	p := time.Duration(z.Penalty)
	switch {
	case p == 0:
		return 0, nil
	case p < time.Millisecond:
		return 0, fmt.Errorf("penalty must be at least 1ms, got %s", p)
	case p%time.Millisecond != 0:
		return 0, fmt.Errorf("penalty must be a whole number of milliseconds, got %s", p)
	case p.Milliseconds() > algorithms.MaxRefill:
		return 0, fmt.Errorf("penalty must not exceed 100 years, got %s", p)
	}
	return p.Milliseconds(), nil
}
