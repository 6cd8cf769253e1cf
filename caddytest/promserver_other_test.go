//go:build !linux

package caddytest_test

import "syscall"

func promProcAttr() *syscall.SysProcAttr { return nil }
