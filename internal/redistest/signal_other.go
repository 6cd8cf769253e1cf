//go:build !unix

package redistest

import (
	"errors"
	"os"
)

var errNoSignals = errors.New("redistest: SIGSTOP/SIGCONT need a unix system")

func signalTerm(p *os.Process) error { return p.Kill() }
func signalStop(*os.Process) error   { return errNoSignals }
func signalCont(*os.Process) error   { return nil }
