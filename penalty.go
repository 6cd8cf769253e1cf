package sluice

import (
	"fmt"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// A zone's penalty (`penalty <duration>`): once the zone refuses a key, the
// key is refused for that long, whatever its bucket would allow sooner
// (algorithms/penalty.go has the semantics; both stores keep the penalty
// with the key's state, in the one store call, and an admin reset ends it).
// It travels in the zone's limit (algorithms.Limit.Penalty), so one zone
// name carries one penalty across the configuration, as it carries one
// limit.

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
