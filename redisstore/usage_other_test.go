//go:build !unix

package redisstore

import "time"

// procUsage is unavailable here: the benchmarks report no CPU time.
func procUsage() (cpu time.Duration, switches int64, ok bool) { return 0, 0, false }
