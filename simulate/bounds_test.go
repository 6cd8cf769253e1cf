package simulate_test

// Issue 23, items 7 and 8: a replay that decides nothing says so, and the
// replay is bounded (lines, fields, pattern parameters, keys) and never
// fatal on a bad line.

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/sluicehq/caddy-sluice/simulate"
)

// ipSite is a site addressed by an IP and a port, as `caddy run` users
// write it: its routes match the host 127.0.0.1.
const ipSite = `{
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
}`

// writeFile writes s to a file of the test's and returns its path.
func writeFile(t testing.TB, name, s string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// oneKeyCSV is n rows of one client, a millisecond apart.
func oneKeyCSV(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%.3f,198.51.100.7,/,\n", 1767225600+float64(i)/1000)
	}
	return b.String()
}

func zoneCounts(rep *simulate.Report, zone string) [3]int64 {
	for _, z := range rep.Zones {
		if z.Name == zone {
			return [3]int64{z.Decided, z.Allowed, z.Refused}
		}
	}
	return [3]int64{-1, -1, -1}
}

func hasNote(rep *simulate.Report, parts ...string) bool {
	for _, n := range rep.Notes {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(n, p)
		}
		if all {
			return true
		}
	}
	return false
}

// TestDefaultHostOfIPSite: CSV rows without a host and a pattern's
// requests go to the one site's host, here an address: 105 requests of
// one client, 15 allowed and 90 refused (before, none reached the site).
func TestDefaultHostOfIPSite(t *testing.T) {
	cfg := adapt(t, ipSite)
	csv := writeFile(t, "t.csv", oneKeyCSV(105))
	for _, traffic := range []string{csv, "steady:rate=1000,duration=105ms"} {
		rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: traffic})
		if err != nil {
			t.Fatal(err)
		}
		if got := zoneCounts(rep, "api"); got != [3]int64{105, 15, 90} {
			t.Errorf("%s: zone api decided/allowed/refused %v, want [105 15 90]; notes %q", traffic, got, rep.Notes)
		}
	}
}

// TestSeveralSitesHostNote: with several sites, rows without a host go to
// the first, and a note names every site and --host.
func TestSeveralSitesHostNote(t *testing.T) {
	cfg := adapt(t, `{
	admin off
}
http://a.example:8080, http://b.example:8080 {
	rate_limit {
		zone api {
			key {client_ip}
			events 15
			window 1m
		}
	}
	respond "ok"
}
http://c.example:8080 {
	respond "c"
}`)
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: writeFile(t, "t.csv", oneKeyCSV(20))})
	if err != nil {
		t.Fatal(err)
	}
	if got := zoneCounts(rep, "api"); got != [3]int64{20, 15, 5} {
		t.Errorf("zone api %v, want [20 15 5] (the first site's host)", got)
	}
	if !hasNote(rep, "a.example", "b.example", "c.example", "--host") {
		t.Errorf("no note naming the sites and --host: %q", rep.Notes)
	}
	rep, err = simulate.Run(simulate.Options{Config: cfg, Traffic: writeFile(t, "t.csv", oneKeyCSV(20)), Host: "c.example:8080"})
	if err != nil {
		t.Fatal(err)
	}
	if got := zoneCounts(rep, "api"); got[0] != 0 {
		t.Errorf("--host c.example: zone api decided %d, want 0 (that site has no rate_limit)", got[0])
	}
	if !hasNote(rep, "20 of 20 requests", "c.example:8080", "/") {
		t.Errorf("no note saying that no request was decided, with the host tried: %q", rep.Notes)
	}
}

// TestUndecidedNote: an access log whose host is not the site's decides
// nothing, and the report says so, naming the hosts and paths it tried;
// --host replays every line at the site's host. A line without a method
// is a GET.
func TestUndecidedNote(t *testing.T) {
	cfg := adapt(t, ipSite)
	var b strings.Builder
	for i := range 30 {
		l := accessLine(1.7e9+float64(i)/1000, "192.0.2.1", "GET", fmt.Sprintf("/p%d", i%3), "")
		b.WriteString(strings.Replace(l, `"host":"localhost:8080"`, `"host":"www.example.com"`, 1) + "\n")
	}
	p := writeFile(t, "a.log", b.String())
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
	if err != nil {
		t.Fatal(err)
	}
	if got := zoneCounts(rep, "api"); got[0] != 0 {
		t.Fatalf("zone api decided %d, want 0", got[0])
	}
	if !hasNote(rep, "30 of 30 requests", "www.example.com", "/p0", "/p1", "/p2", "--host") {
		t.Errorf("no note naming the hosts and paths tried: %q", rep.Notes)
	}
	var table strings.Builder
	rep.WriteTable(&table)
	if !strings.Contains(table.String(), "www.example.com") {
		t.Errorf("the table does not say it:\n%s", table.String())
	}

	rep, err = simulate.Run(simulate.Options{Config: cfg, Traffic: p, Host: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := zoneCounts(rep, "api"); got != [3]int64{30, 15, 15} {
		t.Errorf("--host 127.0.0.1: zone api %v, want [30 15 15]", got)
	}
	if hasNote(rep, "requests were decided by no zone") {
		t.Errorf("a note of undecided requests when all were decided: %q", rep.Notes)
	}

	// No method: a GET.
	noMethod := strings.Replace(accessLine(1.7e9, "192.0.2.1", "", "/", ""), `"method":"",`, "", 1)
	noMethod = strings.Replace(noMethod, `"host":"localhost:8080"`, `"host":"127.0.0.1:8080"`, 1)
	rep, err = simulate.Run(simulate.Options{Config: cfg, Traffic: writeFile(t, "m.log", noMethod+"\n")})
	if err != nil {
		t.Fatal(err)
	}
	if got := zoneCounts(rep, "api"); rep.Counts.Requests != 1 || got != [3]int64{1, 1, 0} {
		t.Errorf("a line without method: counts %+v, zone %v; want one request decided", rep.Counts, got)
	}
}

// TestLongLinesAreMalformed: a line past the bound is malformed and
// counted, and the lines around it are replayed (before, an access log line
// over 4 MB ended the replay with an error).
func TestLongLinesAreMalformed(t *testing.T) {
	cfg := adapt(t, ipSite)
	good := strings.Replace(accessLine(1.7e9, "192.0.2.1", "GET", "/", ""), `"host":"localhost:8080"`, `"host":"127.0.0.1"`, 1)
	huge := strings.Replace(good, `"/"`, `"/`+strings.Repeat("x", 5<<20)+`"`, 1)
	p := writeFile(t, "a.log", good+"\n"+huge+"\n"+good+"\n")
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
	if err != nil {
		t.Fatalf("a long line ended the replay: %v", err)
	}
	if c := rep.Counts; c.Lines != 3 || c.Requests != 2 || c.Malformed != 1 {
		t.Errorf("counts %+v, want 3 lines: 2 requests, 1 malformed", c)
	}

	// A CSV: a key past the field bound and a line past the line bound are
	// malformed; the rows around them count.
	row := "1767225600,198.51.100.7,/,\n"
	csv := row + "1767225600," + strings.Repeat("k", 100<<10) + ",/,\n" + row +
		"1767225600,k,/" + strings.Repeat("p", 2<<20) + ",\n" + row
	rep, err = simulate.Run(simulate.Options{Config: cfg, Traffic: writeFile(t, "t.csv", csv)})
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.Counts; c.Requests != 3 || c.Malformed != 2 {
		t.Errorf("CSV counts %+v, want 3 requests and 2 malformed", c)
	}
}

// TestHugeFieldIsNotHeld: a 64 MB CSV field is skipped without being held:
// the replay allocates far less than the field (before, it was read whole
// and became a key).
func TestHugeFieldIsNotHeld(t *testing.T) {
	cfg := adapt(t, ipSite)
	p := filepath.Join(t.TempDir(), "t.csv")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("1767225600,")
	chunk := strings.Repeat("k", 1<<20)
	for range 64 {
		f.WriteString(chunk)
	}
	f.WriteString(",/,\n1767225601,198.51.100.7,/,\n")
	f.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.Counts; c.Requests != 1 || c.Malformed != 1 {
		t.Errorf("counts %+v, want 1 request and 1 malformed", c)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
		t.Errorf("the replay allocated %d MB for a 64 MB field: it was held", alloc>>20)
	}
}

// TestPatternParametersRange: every pattern parameter is checked before
// any arithmetic: an error names the parameter (before, size=2e18
// overflowed past the cap and size=9223372036854775807 made 0 requests).
func TestPatternParametersRange(t *testing.T) {
	cfg := adapt(t, ipSite)
	for _, c := range []struct{ spec, param string }{
		{"burst:size=9223372036854775807", "size="},
		{"burst:size=2e18", "size="},
		{"burst:size=1.5", "size="},
		{"burst:every=1ns", "every="},
		{"steady:rate=1e300", "rate="},
		{"steady:duration=100000h", "duration="},
		{"ramp:to=1e18,duration=1h", "to="},
		{"sawtooth:from=1e10", "from="},
		{"window-edge:events=1e19", "events="},
		{"window-edge:times=-1", "times="},
		{"window-edge:times=1e12,events=100", "times="},
		{"steady:keys=0", "keys="},
		{"steady:keys=1e40", "keys="},
		{"steady:rate=50000,duration=24h", "about"},
		{"steady:rate=10,rate=20", "rate is given twice"},
	} {
		_, err := simulate.Run(simulate.Options{Config: cfg, Traffic: c.spec})
		if err == nil || !strings.Contains(err.Error(), c.param) {
			t.Fatalf("%s: error %v, want one naming %q", c.spec, err, c.param)
		}
	}
}

// TestOutOfOrderNote: rows earlier than one already replayed are replayed
// at the latest instant so far, and counted in a note.
func TestOutOfOrderNote(t *testing.T) {
	cfg := adapt(t, ipSite)
	csv := "1767225610,198.51.100.7,/,\n1767225600,198.51.100.7,/,\n1767225605,198.51.100.7,/,\n1767225611,198.51.100.7,/,\n"
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: writeFile(t, "t.csv", csv)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Counts.OutOfOrder != 2 || !hasNote(rep, "2 requests", "out of time order") {
		t.Errorf("out of order %d, notes %q; want 2 and a note", rep.Counts.OutOfOrder, rep.Notes)
	}
}

// TestMaxKeys: past --max-keys, the replay stops and says where; the
// report covers the traffic up to there.
func TestMaxKeys(t *testing.T) {
	cfg := adapt(t, ipSite)
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: "steady:rate=100,duration=10s,keys=1000,key=user", MaxKeys: 100})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Stopped == "" || !strings.Contains(rep.Stopped, "--max-keys 100") {
		t.Errorf("stopped %q, want the reason naming --max-keys 100", rep.Stopped)
	}
	if z := rep.Zones[0]; z.Keys != 101 || z.Decided != 101 || rep.Counts.Requests != 101 {
		t.Errorf("zone keys %d decided %d, requests %d: want 101 (stopped at the key past the bound)", z.Keys, z.Decided, rep.Counts.Requests)
	}
	rep, err = simulate.Run(simulate.Options{Config: cfg, Traffic: "steady:rate=100,duration=10s,keys=1000,key=user"})
	if err != nil || rep.Stopped != "" || rep.Zones[0].Keys != 1000 {
		t.Errorf("without --max-keys: %v, stopped %q", err, rep.Stopped)
	}
}

// TestDefaultHostOfHTTPSSite: a site with a domain name (automatic HTTPS
// adds a server redirecting port 80): its requests go to the site, not to
// the redirect.
func TestDefaultHostOfHTTPSSite(t *testing.T) {
	cfg := adapt(t, `{
	admin off
}
example.com {
	rate_limit {
		zone api {
			key {client_ip}
			events 15
			window 1m
		}
	}
	respond "ok"
}`)
	for _, o := range []simulate.Options{
		{Traffic: "steady:rate=1000,duration=105ms"},
		{Traffic: "steady:rate=1000,duration=105ms", Host: "example.com"},
	} {
		o.Config = cfg
		rep, err := simulate.Run(o)
		if err != nil {
			t.Fatal(err)
		}
		if got := zoneCounts(rep, "api"); got != [3]int64{105, 15, 90} {
			t.Errorf("host %q: zone api %v, want [105 15 90]; notes %q", o.Host, got, rep.Notes)
		}
	}
}
