//go:build unix

package sluice

import (
	"syscall"
	"time"
)

// processCPU is this process's CPU time so far (user and system, every
// thread): what a benchmark spends per operation, steadier on a shared
// machine than its wall time, which counts the waits for a core too.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
