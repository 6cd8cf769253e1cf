// Package fleet_test holds Sluice's fleet tests: several real Caddy
// processes (the binary built from cmd/caddy) sharing real Redis servers
// (internal/redistest: standalone, Cluster, Sentinel), exercised over
// loopback HTTP. Nothing is mocked.
//
// TestMain builds the binary once; every test starts its own Redis and its
// own Caddy processes on free ports (redistest.FreePort), each with its own
// admin endpoint and XDG directories, and stops them at its cleanup. Tests
// never run in parallel: the machine this runs on may have two cores, and
// several Caddy processes plus Redis plus the load generator already share
// them.
package fleet_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// caddyBin is the Caddy binary (stock Caddy plus Sluice) built by TestMain.
var caddyBin string

// burstClientBin is testdata/burstclient.go built by TestMain: one client
// process of a burst (late_test.go).
var burstClientBin string

// nonce distinguishes the keys of this run from any other's.
var nonce = strconv.FormatInt(time.Now().UnixNano(), 36)

func TestMain(m *testing.M) {
	tmp, err := os.MkdirTemp("", "sluice-fleet-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet: creating a temp dir:", err)
		os.Exit(1)
	}
	caddyBin = filepath.Join(tmp, "caddy")
	t0 := time.Now()
	cmd := exec.Command("go", "build", "-o", caddyBin, "github.com/sluicehq/caddy-sluice/cmd/caddy")
	out, err := cmd.CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "fleet: building the Caddy binary failed: %v\n%s\n", err, out)
		os.RemoveAll(tmp)
		os.Exit(1)
	}
	burstClientBin = filepath.Join(tmp, "burstclient")
	if out, err := exec.Command("go", "build", "-o", burstClientBin, "testdata/burstclient.go").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "fleet: building the burst client failed: %v\n%s\n", err, out)
		os.RemoveAll(tmp)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "fleet: built %s and the burst client in %v\n", caddyBin, time.Since(t0).Round(time.Millisecond))
	code := m.Run()
	os.RemoveAll(tmp)
	os.Exit(code)
}
