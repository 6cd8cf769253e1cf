package caddytest_test

// The simulator against the production path: the same traffic replayed by
// `caddy rate-limit simulate` (package simulate) and sent over HTTP to the
// real Caddy of this package gives identical per-zone counts, for every
// algorithm; and Caddy's own access log, written by that Caddy, round-trips
// through the simulator.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/memstore"
	"github.com/sluicehq/caddy-sluice/simulate"
)

// testClock is the virtual clock of the testclock store (Unix ms).
var testClock atomic.Int64

// clockStore is http.handlers.rate_limit.stores.testclock: the memory
// store on testClock, so a real Caddy decides at the instants a test
// chooses (the memory store's injectable clock).
type clockStore struct{}

var clockMem = memstore.New(memstore.Config{SweepInterval: -1, Now: testClock.Load})

func init() { caddy.RegisterModule(clockStore{}) }

func (clockStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.rate_limit.stores.testclock", New: func() caddy.Module { return new(clockStore) }}
}

func (*clockStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { d.Next(); return nil }

func (*clockStore) Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
	return clockMem.Take(ctx, reqs, out)
}

func (*clockStore) Key() string { return "testclock" }

// adapt turns a Caddyfile into JSON.
func adapt(t *testing.T, cf string) []byte {
	t.Helper()
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
	if err != nil {
		t.Fatalf("adapting: %v\n%s", err, cf)
	}
	return js
}

// activityCounts reads GET /rate_limit/activity: zone → [allowed, refused,
// vetoed, report_only_refused].
func activityCounts(t *testing.T) map[string][4]int64 {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(adminURL + "/rate_limit/activity")
	if err != nil {
		t.Fatalf("GET /rate_limit/activity: %v", err)
	}
	defer resp.Body.Close()
	var doc struct {
		Zones []struct {
			Name                                        string
			Allowed, Refused, Vetoed, ReportOnlyRefused int64 `json:"-"`
		}
	}
	var raw struct {
		Zones []map[string]any `json:"zones"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	_ = doc
	out := map[string][4]int64{}
	for _, z := range raw.Zones {
		n := func(k string) int64 { f, _ := z[k].(float64); return int64(f) }
		out[z["name"].(string)] = [4]int64{n("allowed"), n("refused"), n("vetoed"), n("report_only_refused")}
	}
	return out
}

// simCounts maps a report's zones to [allowed, refused, vetoed, would refuse].
func simCounts(rep *simulate.Report) map[string][4]int64 {
	out := map[string][4]int64{}
	for _, z := range rep.Zones {
		out[z.Name] = [4]int64{z.Allowed, z.Refused, z.Vetoed, z.WouldRefuse}
	}
	return out
}

// sendSim sends a simulator request to the real Caddy: its method, URI, Host
// and headers, with its remote address as X-Forwarded-For (the configs
// trust loopback as a proxy, so Caddy's {client_ip} is that address).
func sendSim(t *testing.T, c *http.Client, site string, r simulate.Request) int {
	t.Helper()
	req, err := http.NewRequest(r.Method, site+r.URI, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Method == "" {
		req.Method = http.MethodGet
	}
	for k, v := range r.Header {
		req.Header[k] = v
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		req.Header.Set("X-Forwarded-For", ip)
	}
	resp, err := doRetry(t, c, req)
	if err != nil {
		t.Fatalf("%s %s: %v", r.Method, r.URI, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

const simSites = `
:@A@ {
	rate_limit {
		zone @Z1@ {
			match {
				path /api/*
			}
			key {http.request.header.X-Client} {client_ip}
			events 5
			window 10s
			algorithm @ALG@
			@BURST@
		}
		zone @Z2@ {
			key {client_ip}
			events 12
			window 30s
			algorithm @ALG@
			cost {http.request.header.X-Cost}
		}
		zone @Z3@ {
			key {http.request.header.X-Client}
			events 3
			window 5s
			algorithm @ALG@
			report_only
		}
		store testclock
	}
	@login path /login
	rate_limit @login {
		zone @Z4@ {
			key {http.request.header.X-Client} {client_ip}
			events 2
			window 20s
			algorithm @ALG@
		}
		store testclock
	}
	respond "ok"
}`

// simCSV writes n rows of time,key,path,cost: keys that are addresses and
// keys that are not, paths inside and outside the zones, costs 1 to 3.
func simCSV(t *testing.T, seed uint64, n int) string {
	rnd := rand.New(rand.NewPCG(seed, 19))
	keys := []string{"203.0.113.5", "203.0.113.6", "2001:db8::7", "alice", "bob", "k_live_1"}
	paths := []string{"/api/items", "/api/search?q=x", "/login", "/", "/other"}
	var b strings.Builder
	b.WriteString("time,key,path,cost\n")
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixMilli()
	for range n {
		t0 += int64(rnd.IntN(700))
		cost := ""
		if rnd.IntN(3) == 0 {
			cost = fmt.Sprint(1 + rnd.IntN(3))
		}
		fmt.Fprintf(&b, "%s,%s,%s,%s\n", time.UnixMilli(t0).UTC().Format(time.RFC3339Nano), keys[rnd.IntN(len(keys))], paths[rnd.IntN(len(paths))], cost)
	}
	p := filepath.Join(t.TempDir(), "traffic.csv")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSimulateMatchesCaddy replays a CSV through the simulator and sends
// the same requests to the real Caddy, each at its instant of the memory
// store's injected clock: the per-zone counts (allowed, refused, vetoed,
// would refuse) are identical, for every algorithm.
func TestSimulateMatchesCaddy(t *testing.T) {
	tc := newTester(t)
	const global = "\tservers {\n\t\ttrusted_proxies static 127.0.0.1/8 ::1\n\t}"
	for a := range algorithms.SlidingLog + 1 {
		alg := a.String()
		t.Run(alg, func(t *testing.T) {
			burst := ""
			if a.AllowsBurst() {
				burst = "burst 7"
			}
			z1, z2, z3, z4 := zoneName("sim_api"), zoneName("sim_cost"), zoneName("sim_report"), zoneName("sim_login")
			cf := config(global, simSites, "Z1", z1, "Z2", z2, "Z3", z3, "Z4", z4, "ALG", alg, "BURST", burst)
			csv := simCSV(t, uint64(a)+1, 300)

			rep, err := simulate.Run(simulate.Options{Config: adapt(t, cf), Traffic: csv})
			if err != nil {
				t.Fatal(err)
			}
			reqs, counts, err := simulate.Requests(simulate.Options{Config: adapt(t, cf), Traffic: csv})
			if err != nil {
				t.Fatal(err)
			}
			if counts.Requests != 300 || counts.Malformed != 0 {
				t.Fatalf("CSV read as %+v, want 300 requests", counts)
			}

			load(t, tc, cf)
			c := loopbackClient(1)
			for _, r := range reqs {
				testClock.Store(r.Time)
				sendSim(t, c, siteA, r)
			}
			real := activityCounts(t)
			sim := simCounts(rep)
			for _, z := range []string{z1, z2, z3, z4} {
				if real[z] != sim[z] {
					t.Errorf("zone %s: real Caddy [allowed refused vetoed would-refuse] = %v, simulator %v", z, real[z], sim[z])
				} else {
					t.Logf("zone %s: %v in both", z, sim[z])
				}
			}
			if sim[z1][1]+sim[z2][1]+sim[z4][1] == 0 || sim[z3][3] == 0 {
				t.Errorf("the traffic refused nothing (%v): the comparison is too weak", sim)
			}
		})
	}
}

// TestSimulateAccessLog: a real Caddy writes its access log (five zones,
// one per algorithm, keyed on a header and on {client_ip} behind a trusted
// proxy); the simulator reads it back as the requests that were sent, and
// its per-zone counts equal the real ones. Malformed lines appended to the
// log are counted and skipped.
func TestSimulateAccessLog(t *testing.T) {
	tc := newTester(t)
	logPath := filepath.Join(t.TempDir(), "access.log")
	const global = "\tservers {\n\t\ttrusted_proxies static 127.0.0.1/8 ::1\n\t}"
	var zones strings.Builder
	var names []string
	for a := range algorithms.SlidingLog + 1 {
		n := zoneName("log_" + a.String())
		names = append(names, n)
		key := "{http.request.header.X-Client} {client_ip}"
		if a%2 == 1 {
			key = "{client_ip}"
		}
		fmt.Fprintf(&zones, "\t\tzone %s {\n\t\t\tkey %s\n\t\t\tevents %d\n\t\t\twindow 1h\n\t\t\talgorithm %s\n\t\t}\n", n, key, 3+int(a), a)
	}
	cf := config(global, `
:@A@ {
	log {
		output file @LOG@
		format json
	}
	rate_limit /api/* {
@ZONES@	}
	respond "ok"
}`, "LOG", logPath, "ZONES", zones.String())
	load(t, tc, cf)

	type sent struct{ method, uri, client, xff string }
	var want []sent
	c := loopbackClient(1)
	rnd := rand.New(rand.NewPCG(7, 19))
	for i := range 80 {
		s := sent{method: []string{"GET", "POST", "DELETE"}[rnd.IntN(3)], uri: fmt.Sprintf("/api/v%d?i=%d", rnd.IntN(2), i)}
		if rnd.IntN(4) == 0 {
			s.uri = "/public"
		}
		if rnd.IntN(2) == 0 {
			s.client = fmt.Sprintf("user%d", rnd.IntN(3))
		}
		s.xff = fmt.Sprintf("198.51.100.%d", rnd.IntN(4))
		req, _ := http.NewRequest(s.method, siteA+s.uri, nil)
		if s.client != "" {
			req.Header.Set("X-Client", s.client)
		}
		req.Header.Set("X-Forwarded-For", s.xff)
		resp, err := doRetry(t, c, req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want = append(want, s)
	}
	real := activityCounts(t)
	// Stop logging (a config without the log) so the file is complete.
	load(t, tc, config("", `:@A@ {
	respond "ok"
}`))

	raw, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// Round trip: the log reads back as the requests sent, in order.
	reqs, counts, err := simulate.Requests(simulate.Options{Config: adapt(t, cf), Traffic: logPath})
	if err != nil {
		t.Fatal(err)
	}
	if counts.Requests != int64(len(want)) || counts.Malformed != 0 {
		t.Fatalf("log read as %+v, want %d requests and no malformed line", counts, len(want))
	}
	for i, r := range reqs {
		w := want[i]
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		if r.Method != w.method || r.URI != w.uri || r.Header.Get("X-Client") != w.client ||
			r.Header.Get("X-Forwarded-For") != w.xff || ip != "127.0.0.1" || r.Host != strings.TrimPrefix(siteA, "http://") {
			t.Errorf("request %d: read back %s %s host %s X-Client %q XFF %q from %s; sent %+v",
				i, r.Method, r.URI, r.Host, r.Header.Get("X-Client"), r.Header.Get("X-Forwarded-For"), r.RemoteAddr, w)
		}
	}

	// Malformed lines among Caddy's own: counted, skipped, the same counts.
	mangled := filepath.Join(t.TempDir(), "mangled.log")
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	bad := []string{`{"ts":`, `not json at all`, `{"logger":"http.log.access","ts":1,"request":{"uri":17}}`, `[1,2,3]`, `{"logger":"http.log.access.log0","msg":"handled request"}`}
	i := 0
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
		if i < len(bad) {
			b.WriteString(bad[i] + "\n")
			i++
		}
	}
	b.WriteString(`{"level":"info","logger":"http.handlers.rate_limit","msg":"other"}` + "\n")
	if err := os.WriteFile(mangled, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, traffic := range []string{logPath, mangled} {
		rep, err := simulate.Run(simulate.Options{Config: adapt(t, cf), Traffic: traffic})
		if err != nil {
			t.Fatal(err)
		}
		wantBad := int64(0)
		if traffic == mangled {
			wantBad = int64(len(bad))
		}
		if rep.Counts.Requests != int64(len(want)) || rep.Counts.Malformed+rep.Counts.Skipped != wantBad+btoi(traffic == mangled) {
			t.Errorf("%s: counts %+v, want %d requests and %d malformed or skipped", filepath.Base(traffic), rep.Counts, len(want), wantBad)
		}
		sim := simCounts(rep)
		for _, z := range names {
			if real[z] != sim[z] {
				t.Errorf("%s: zone %s: real Caddy %v, simulator %v", filepath.Base(traffic), z, real[z], sim[z])
			}
		}
	}
	t.Logf("real counts: %v", real)
}

func btoi(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// simulateBin is `caddy` (cmd/caddy: stock Caddy plus Sluice) built once
// for the tests that run `caddy rate-limit simulate` as a user does.
var (
	simulateBinOnce sync.Once
	simulateBinPath string
	simulateBinErr  error
)

func simulateBin(t *testing.T) string {
	t.Helper()
	simulateBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-simulate-bin-")
		if err != nil {
			simulateBinErr = err
			return
		}
		simulateBinPath = filepath.Join(dir, "caddy")
		out, err := exec.Command("go", "build", "-o", simulateBinPath, "github.com/sluicehq/caddy-sluice/cmd/caddy").CombinedOutput()
		if err != nil {
			simulateBinErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if simulateBinErr != nil {
		t.Fatalf("building caddy: %v", simulateBinErr)
	}
	return simulateBinPath
}

// runSimulate runs `caddy rate-limit simulate` with args, its standard
// error a pipe, and returns its outputs and exit code.
func runSimulate(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, simulateBin(t), append([]string{"rate-limit", "simulate"}, args...)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("caddy rate-limit simulate %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// ipSiteCaddyfile is a site addressed by an IP and a port.
const ipSiteCaddyfile = `{
	admin off
}
http://127.0.0.1:8080 {
	rate_limit {
		zone api {
			key {client_ip}
			events 15
			window 1m
		}
	}
	respond "ok"
}
`

// TestSimulateCommandBounds runs the real command (issue 23, items 7 and
// 8): a CSV without hosts against a site addressed by an IP is decided;
// an access log whose host is no site's says so, naming it; a line over
// the bound is malformed, not fatal; a pattern parameter out of range is
// an error naming it; progress never goes to a standard error that is not
// a terminal, and goes to one that is.
func TestSimulateCommandBounds(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cf := write("Caddyfile", ipSiteCaddyfile)
	var csv strings.Builder
	for i := range 105 {
		fmt.Fprintf(&csv, "%.3f,198.51.100.7,/,\n", 1767225600+float64(i)/1000)
	}
	report := func(stdout string) simulate.Report {
		t.Helper()
		var rep simulate.Report
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatalf("the JSON report: %v\n%s", err, stdout)
		}
		return rep
	}

	out, errOut, code := runSimulate(t, "--config", cf, "--traffic", write("t.csv", csv.String()), "--format", "json")
	if code != 0 {
		t.Fatalf("CSV: exit %d\n%s", code, errOut)
	}
	if z := report(out).Zones[0]; z.Decided != 105 || z.Allowed != 15 || z.Refused != 90 {
		t.Errorf("CSV without hosts: decided %d allowed %d refused %d, want 105, 15, 90", z.Decided, z.Allowed, z.Refused)
	}

	line := func(host, uri string) string {
		return fmt.Sprintf(`{"level":"info","ts":1767225600.5,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"192.0.2.1","remote_port":"5123","proto":"HTTP/1.1","method":"GET","host":"%s","uri":"%s","headers":{}},"duration":0.001,"status":200}`, host, uri)
	}
	logFile := write("other.log", line("www.example.com", "/a")+"\n"+line("www.example.com", "/"+strings.Repeat("x", 5<<20))+"\n"+line("www.example.com", "/b")+"\n")
	out, errOut, code = runSimulate(t, "--config", cf, "--traffic", logFile)
	if code != 0 {
		t.Fatalf("a log with a 5 MB line: exit %d\n%s", code, errOut)
	}
	for _, want := range []string{"2 requests from 3 lines; 1 malformed", "2 of 2 requests were decided by no zone", `"www.example.com"`, `"/a", "/b"`, "--host"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report of a log of another host lacks %q:\n%s", want, out)
		}
	}
	out, _, _ = runSimulate(t, "--config", cf, "--traffic", logFile, "--host", "127.0.0.1", "--format", "json")
	if z := report(out).Zones[0]; z.Decided != 2 {
		t.Errorf("--host 127.0.0.1: decided %d, want 2", z.Decided)
	}

	_, errOut, code = runSimulate(t, "--config", cf, "--traffic", "burst:size=2e18")
	if code == 0 || !strings.Contains(errOut, "size=2e18 is out of range") {
		t.Errorf("burst:size=2e18: exit %d, stderr %q; want an error naming size", code, errOut)
	}

	// A replay of some seconds: no progress on a pipe, progress on a
	// terminal (script(1) gives the command one).
	var big strings.Builder
	for i := range 400_000 {
		fmt.Fprintf(&big, "%d,198.51.%d.%d,/,\n", 1767225600+i/1000, i/250%250, 1+i%250)
	}
	bigCSV := write("big.csv", big.String())
	out, errOut, code = runSimulate(t, "--config", cf, "--traffic", bigCSV)
	if code != 0 || !strings.Contains(out, "400000 requests") {
		t.Fatalf("big CSV: exit %d\n%s\n%s", code, out, errOut)
	}
	if strings.Contains(errOut, "\r") || strings.Contains(errOut, "% read") {
		t.Errorf("progress written to a standard error that is a pipe:\n%q", errOut)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	shell := fmt.Sprintf("%s rate-limit simulate --config %s --traffic %s >/dev/null", simulateBin(t), cf, bigCSV)
	tty, err := exec.CommandContext(ctx, "script", "-q", "-e", "-c", shell, "/dev/null").CombinedOutput()
	if err != nil {
		t.Fatalf("script(1): %v\n%s", err, tty)
	}
	if !regexp.MustCompile(`\r\x1b\[K[0-9,]+ lines, [0-9,]+ lines/s, [0-9]+% read, about \S+ left`).Match(tty) {
		t.Errorf("no progress on a terminal:\n%q", tty)
	}
}
