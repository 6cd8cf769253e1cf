package caddytest_test

import "syscall"

// promProcAttr makes the kernel kill Prometheus when the test binary dies
// (a test timeout, a panic), so no server outlives its test.
func promProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
