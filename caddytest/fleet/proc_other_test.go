//go:build !linux

package fleet_test

import "syscall"

// sysProcAttr: no parent-death signal outside Linux; t.Cleanup stops the
// processes.
func sysProcAttr() *syscall.SysProcAttr { return nil }
