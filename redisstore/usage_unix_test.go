//go:build unix

package redisstore

import (
	"syscall"
	"time"
)

// procUsage is this process's CPU time (user and system, every thread) and
// its context switches (voluntary and not) so far: what a benchmark spends
// per operation on the client side, steadier on a shared machine than the
// wall time per operation (which also counts Redis's CPU and everyone
// else's).
func procUsage() (cpu time.Duration, switches int64, ok bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw + ru.Nivcsw, true
}
