package fleet_test

import "syscall"

// sysProcAttr makes the kernel kill a Caddy process when the test binary
// dies (a test timeout, a panic), so none outlives its test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
