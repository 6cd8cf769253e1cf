//go:build !unix

package sluice

import "time"

// processCPU is unavailable here: the benchmarks report no CPU time.
func processCPU() (time.Duration, bool) { return 0, false }
