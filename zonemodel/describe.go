package zonemodel

import (
	"fmt"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// DescribeDynamic renders a limit and the placeholders that choose it per
// request.
func DescribeDynamic(l algorithms.Limit, dyn string) string {
	if dyn == "" {
		return DescribeLimit(l)
	}
	return DescribeLimit(l) + " " + dyn
}

// DescribeLimit renders a limit as the Caddyfile would write it.
func DescribeLimit(l algorithms.Limit) string {
	if l.Algorithm == algorithms.Concurrency {
		return fmt.Sprintf("concurrent %d lease %s", l.Events, time.Duration(l.Window)*time.Millisecond)
	}
	s := fmt.Sprintf("events %d window %s", l.Events, time.Duration(l.Window)*time.Millisecond)
	if l.Burst > 0 {
		s += fmt.Sprintf(" burst %d", l.Burst)
	}
	if l.Penalty > 0 {
		s += fmt.Sprintf(" penalty %s", time.Duration(l.Penalty)*time.Millisecond)
	}
	if l.Delay > 0 {
		s += fmt.Sprintf(" delay %s", time.Duration(l.Delay)*time.Millisecond)
	}
	if l.DelayAfter > 0 {
		s += fmt.Sprintf(" delay_after %d", l.DelayAfter)
	}
	return s + " algorithm " + l.Algorithm.String()
}
