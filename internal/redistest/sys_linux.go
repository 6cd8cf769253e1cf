package redistest

import "syscall"

// sysProcAttr makes the kernel kill a server when the test binary dies
// (a test timeout, a panic, SIGKILL), so no server outlives its tests.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
