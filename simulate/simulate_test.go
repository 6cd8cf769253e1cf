package simulate_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/sluicehq/caddy-sluice"
	"github.com/sluicehq/caddy-sluice/simulate"
)

func adapt(t testing.TB, cf string) []byte {
	t.Helper()
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cf), nil)
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	return js
}

const edgeConfig = `{
	admin off
}
:8080 {
	rate_limit /api/* {
		zone api {
			key {client_ip}
			events 100
			window 1m
		}
	}
	respond "ok"
}`

// TestCompareWindowEdge: the window-edge pattern gives a fixed window
// twice its limit, and every other algorithm about its limit once.
func TestCompareWindowEdge(t *testing.T) {
	rep, err := simulate.Run(simulate.Options{Config: adapt(t, edgeConfig), Traffic: "window-edge:path=/api/x", Compare: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Compare == nil || len(rep.Compare.Algorithms) != 5 {
		t.Fatalf("compare: %+v", rep.Compare)
	}
	for _, z := range rep.Compare.Algorithms {
		t.Logf("%-14s allowed %d refused %d", z.Algorithm, z.Allowed, z.Refused)
		if z.Decided != 200 {
			t.Errorf("%s: decided %d, want 200", z.Algorithm, z.Decided)
		}
		switch z.Algorithm {
		case "fixed_window":
			if z.Allowed != 200 {
				t.Errorf("fixed_window admitted %d of the boundary burst, want 200 (twice the limit)", z.Allowed)
			}
		default:
			// Spread 600ms around the boundary: a refill of about 2.
			if z.Allowed < 100 || z.Allowed > 103 {
				t.Errorf("%s admitted %d, want about the limit (100..103)", z.Algorithm, z.Allowed)
			}
		}
	}
	var b bytes.Buffer
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "fixed_window") || !strings.Contains(b.String(), "sliding_log") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestPatterns: each pattern makes the requests its parameters say.
func TestPatterns(t *testing.T) {
	cfg := adapt(t, edgeConfig)
	for _, c := range []struct {
		spec string
		want int64
	}{
		{"steady:rate=10,duration=1m,path=/api/x", 600},
		{"burst:size=50,every=1m,duration=3m,path=/api/x", 150},
		{"window-edge:events=30,window=10s,times=2,path=/api/x", 120},
		{"ramp:from=0,to=20,duration=10s,path=/api/x", 100},
		{"sawtooth:from=0,to=20,period=5s,duration=10s,path=/api/x", 100},
	} {
		rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: c.spec})
		if err != nil {
			t.Fatalf("%s: %v", c.spec, err)
		}
		got := rep.Counts.Requests
		if got < c.want-2 || got > c.want+2 {
			t.Errorf("%s: %d requests, want about %d", c.spec, got, c.want)
		}
		if rep.Zones[0].Decided != got {
			t.Errorf("%s: zone decided %d of %d", c.spec, rep.Zones[0].Decided, got)
		}
	}
	for _, bad := range []string{"steady:rate=x", "burst:every=-1s", "steady:bogus=1", "window-edge:spread=2m,window=1m", "steady:path=nope"} {
		if _, err := simulate.Run(simulate.Options{Config: cfg, Traffic: bad}); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

// TestCSVKeyPlacement: a CSV key that is an address is the client's
// address; another goes into the header the zone keys on; the cost column
// into the cost header.
func TestCSVKeyPlacement(t *testing.T) {
	cfg := adapt(t, `{
	admin off
}
:8080 {
	rate_limit {
		zone by_key {
			key {http.request.header.X-Api-Key} {client_ip}
			events 3
			window 1h
			cost {http.request.header.X-Cost}
		}
	}
	respond "ok"
}`)
	csv := "time,key,path,cost\n" +
		"2026-01-01T00:00:00Z,203.0.113.9,/a,\n" +
		"2026-01-01T00:00:01Z,203.0.113.9,/a,2\n" +
		"2026-01-01T00:00:02Z,203.0.113.9,/a,\n" + // refused: 3 spent
		"2026-01-01T00:00:03Z,k_live_1,/a,3\n" +
		"2026-01-01T00:00:04Z,k_live_1,/a,\n" + // refused
		"not a time,x,/a,\n" +
		"2026-01-01T00:00:05Z,k_live_2,/a,0\n" // malformed cost
	p := filepath.Join(t.TempDir(), "t.csv")
	os.WriteFile(p, []byte(csv), 0o644)
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
	if err != nil {
		t.Fatal(err)
	}
	z := rep.Zones[0]
	if rep.Counts.Requests != 5 || rep.Counts.Malformed != 2 || z.Allowed != 3 || z.Refused != 2 || z.Keys != 2 {
		t.Errorf("counts %+v, zone allowed %d refused %d keys %d; want 5 requests, 2 malformed, 3 allowed, 2 refused, 2 keys", rep.Counts, z.Allowed, z.Refused, z.Keys)
	}
	if len(z.TopKeys) != 2 || !strings.HasPrefix(z.TopKeys[0].Token, "41-") && !strings.HasPrefix(z.TopKeys[0].Token, "42-") && !strings.HasPrefix(z.TopKeys[0].Token, "h1-") {
		t.Errorf("top keys %+v", z.TopKeys)
	}
	var js bytes.Buffer
	rep.WriteJSON(&js)
	if strings.Contains(js.String(), "k_live_1") || strings.Contains(js.String(), "203.0.113.9") {
		t.Errorf("the report shows a raw key:\n%s", js.String())
	}
}

// accessLine is one access log line as Caddy writes it.
func accessLine(ts float64, ip, method, uri, client string) string {
	hdr := `"User-Agent":["curl/8.0"]`
	if client != "" {
		hdr += `,"X-Api-Key":["` + client + `"]`
	}
	return fmt.Sprintf(`{"level":"info","ts":%.6f,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"%s","remote_port":"51234","client_ip":"%s","proto":"HTTP/1.1","method":"%s","host":"localhost:8080","uri":"%s","headers":{%s}},"bytes_read":0,"user_id":"","duration":0.000412,"size":2,"status":200,"resp_headers":{"Server":["Caddy"]}}`,
		ts, ip, ip, method, uri, hdr)
}

// FuzzAccessLogLine: no line, however malformed, crashes the reader; a
// line is a request, malformed or skipped.
func FuzzAccessLogLine(f *testing.F) {
	f.Add(accessLine(1.7e9, "192.0.2.1", "GET", "/api/x", "k1"))
	f.Add(`{"ts":"2026-01-01T00:00:00Z","request":{"uri":"/","method":"GET","headers":{"A":["b"]},"tls":{"server_name":"x"}},"duration":"1ms"}`)
	f.Add(`{"ts":1e300,"duration":-1,"request":{"uri":"%zz"}}`)
	f.Add(`{"logger":"http.log.access","ts":null,"request":null}`)
	f.Add("\x00\xff{")
	cfg := adapt(f, edgeConfig)
	f.Fuzz(func(t *testing.T, line string) {
		p := filepath.Join(t.TempDir(), "a.log")
		os.WriteFile(p, []byte(line+"\n"+accessLine(1.7e9, "192.0.2.1", "GET", "/api/x", "")+"\n"), 0o644)
		rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
		if err != nil {
			t.Fatal(err)
		}
		c := rep.Counts
		if c.Requests+c.Malformed+c.Skipped != c.Lines && !strings.ContainsAny(line, "\n\r") {
			t.Errorf("counts %+v do not add up", c)
		}
		if c.Requests < 1 {
			t.Errorf("the good line was lost: %+v", c)
		}
	})
}

// writeLog writes n access log lines: clients k0..k(keys-1), 1000 lines a
// second.
func writeLog(t testing.TB, path string, n, keys int) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b bytes.Buffer
	t0 := float64(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Unix())
	for i := range n {
		b.WriteString(accessLine(t0+float64(i)/1000, fmt.Sprintf("198.18.%d.%d", (i%keys)/250, 1+(i%keys)%250), "GET", "/api/items?page="+fmt.Sprint(i%7), fmt.Sprintf("k%d", i%keys)))
		b.WriteByte('\n')
		if b.Len() > 1<<20 {
			f.Write(b.Bytes())
			b.Reset()
		}
	}
	f.Write(b.Bytes())
}

const benchConfig = `{
	admin off
}
:8080 {
	rate_limit /api/* {
		zone per_key {
			key {http.request.header.X-Api-Key} {client_ip}
			events 100
			window 1m
			burst 20
		}
		zone per_ip {
			key {client_ip}
			events 300
			window 1m
			algorithm sliding_window
		}
	}
	respond "ok"
}`

// BenchmarkReplayAccessLog measures the replay of access log lines through
// the production path (b.N lines; reported as lines/s).
func BenchmarkReplayAccessLog(b *testing.B) {
	p := filepath.Join(b.TempDir(), "access.log")
	writeLog(b, p, b.N, 1000)
	cfg := adapt(b, benchConfig)
	b.ResetTimer()
	start := time.Now()
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "lines/s")
	if rep.Counts.Requests != int64(b.N) {
		b.Fatalf("replayed %d of %d", rep.Counts.Requests, b.N)
	}
}

// TestReplayRate replays 50,000 lines (a bounded check that stays fast under
// -race; BenchmarkReplayAccessLog and docs/simulate.md give the rate).
func TestReplayRate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "access.log")
	writeLog(t, p, 50_000, 500)
	rep, err := simulate.Run(simulate.Options{Config: adapt(t, benchConfig), Traffic: p})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Counts.Requests != 50_000 {
		t.Fatalf("counts %+v", rep.Counts)
	}
	var zs []string
	for _, z := range rep.Zones {
		zs = append(zs, fmt.Sprintf("%s %d/%d/%d keys %d", z.Name, z.Decided, z.Allowed, z.Refused, z.Keys))
		if z.Keys != 500 {
			t.Errorf("zone %s: %d keys, want 500", z.Name, z.Keys)
		}
	}
	b, _ := json.Marshal(rep.Counts)
	t.Logf("%s in %s (%d lines/s): %v", b, rep.Elapsed, rep.LinesPerSecond, zs)
}

// TestCountAndDelayZones: a `count` zone is charged only for the logged
// statuses it counts (the replaced upstream answers with the access log's
// status), and a `delay` zone admits late in virtual time, without the
// replay sleeping.
func TestCountAndDelayZones(t *testing.T) {
	cfg := adapt(t, `{
	admin off
}
:8080 {
	rate_limit /login {
		zone failed {
			key {client_ip}
			events 3
			window 1h
			count 401
		}
	}
	rate_limit /hooks {
		zone hooks {
			key {client_ip}
			events 10
			window 1s
			burst 1
			delay 3s
		}
	}
	reverse_proxy localhost:9
}`)
	var log strings.Builder
	line := func(ts float64, uri string, status int) {
		l := accessLine(ts, "192.0.2.7", "POST", uri, "")
		log.WriteString(strings.Replace(l, `"status":200`, fmt.Sprintf(`"status":%d`, status), 1) + "\n")
	}
	// Ten logins: right ones (200) cost nothing, the first three wrong
	// ones (401) spend the budget, so every login after the third wrong
	// one is refused (charged before it runs, it cannot be known right).
	for i, st := range []int{200, 401, 200, 401, 200, 401, 200, 401, 200, 200} {
		line(1.7e9+float64(i), "/login", st)
	}
	// 40 webhooks at one instant: one at once, 30 within the 3 s wait, 9
	// refused.
	for range 40 {
		line(1.7e9+20, "/hooks", 200)
	}
	p := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(p, []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the replay took %v: a delay must wait in virtual time", d)
	}
	got := map[string][2]int64{}
	for _, z := range rep.Zones {
		got[z.Name] = [2]int64{z.Allowed, z.Refused}
	}
	if g := got["failed"]; g != [2]int64{6, 4} {
		t.Errorf("count 401: allowed/refused %v, want [6 4] (three 401s spend the budget; the four logins after the third are refused)", g)
	}
	if g := got["hooks"]; g != [2]int64{31, 9} {
		t.Errorf("delay 3s: allowed/refused %v, want [31 9]", g)
	}
}

// TestConcurrencyZone: a concurrency zone in a replay. The replay is
// sequential (each request's response is written before the next one
// arrives), so every admitted request's slot is released at once: 50
// requests of one client at one instant against `concurrent 1` all pass
// (a slot not released would refuse the second), and the report says
// why. Beside it,
// the rate zone of the same directive decides as usual (all-or-nothing
// with the slot: a refused request takes none), and --compare refuses the
// concurrency zone.
func TestConcurrencyZone(t *testing.T) {
	cfg := adapt(t, `{
	admin off
}
:8080 {
	rate_limit /exports/* {
		zone exports_rate {
			key {client_ip}
			events 30
			window 1m
		}
		zone exports {
			key {client_ip}
			concurrent 1
		}
	}
	reverse_proxy localhost:9
}`)
	var log strings.Builder
	for range 50 {
		log.WriteString(accessLine(1.7e9, "192.0.2.7", "GET", "/exports/1", "") + "\n")
	}
	p := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(p, []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	limits := map[string]string{}
	for _, z := range rep.Zones {
		got[z.Name] = [2]int64{z.Allowed, z.Refused}
		limits[z.Name] = z.Algorithm
	}
	if g := got["exports_rate"]; g != [2]int64{30, 20} {
		t.Errorf("exports_rate: allowed/refused %v, want [30 20]", g)
	}
	// The concurrency zone allows every request it decides (each released
	// before the next); the 20 the rate zone refused are vetoed, not
	// refused by it.
	if g := got["exports"]; g[1] != 0 || g[0] != 30 {
		t.Errorf("exports (concurrent 1): allowed/refused %v, want [30 0]: a sequential replay releases each slot at once", g)
	}
	if limits["exports"] != "concurrency" {
		t.Errorf("exports: algorithm %q in the report, want concurrency", limits["exports"])
	}
	var table strings.Builder
	if err := rep.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "concurrent 1") || !strings.Contains(table.String(), "zone exports: a concurrency zone: the replay is sequential") {
		t.Errorf("the table does not describe the concurrency zone and its note:\n%s", table.String())
	}
	if _, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p, Compare: true, Zone: "exports"}); err == nil || !strings.Contains(err.Error(), "concurrency zone") {
		t.Errorf("--compare of a concurrency zone: %v, want an error naming it a concurrency zone", err)
	}
}

// TestSyncZone: a zone in the asynchronous mode (sync, or the directive's
// distributed block) replays as one instance, exact, and the notes say so
// and state the fleet's bound.
func TestSyncZone(t *testing.T) {
	cfg := adapt(t, `{
	admin off
}
:8080 {
	rate_limit /a {
		zone per_user {
			key {client_ip}
			events 5
			window 1h
			algorithm fixed_window
			sync 50ms
		}
		store redis redis://127.0.0.1:9
	}
	rate_limit /b {
		zone mholt {
			key {client_ip}
			events 3
			window 1h
		}
		distributed {
			read_interval 5s
		}
		store redis redis://127.0.0.1:9
	}
	reverse_proxy localhost:9
}`)
	var log strings.Builder
	for i := range 10 {
		log.WriteString(accessLine(1.7e9+float64(i), "192.0.2.7", "GET", "/a", "") + "\n")
		log.WriteString(accessLine(1.7e9+float64(i), "192.0.2.7", "GET", "/b", "") + "\n")
	}
	p := filepath.Join(t.TempDir(), "access.log")
	if err := os.WriteFile(p, []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := simulate.Run(simulate.Options{Config: cfg, Traffic: p})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	algs := map[string]string{}
	for _, z := range rep.Zones {
		got[z.Name] = [2]int64{z.Allowed, z.Refused}
		algs[z.Name] = z.Algorithm
	}
	if g := got["per_user"]; g != [2]int64{5, 5} {
		t.Errorf("sync: allowed/refused %v, want [5 5]", g)
	}
	if g := got["mholt"]; g != [2]int64{3, 7} || algs["mholt"] != "sliding_window" {
		t.Errorf("distributed: allowed/refused %v, algorithm %q; want [3 7] as a sliding_window", g, algs["mholt"])
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "N + (I-1)(N-G)") {
		t.Errorf("notes %q: want the asynchronous mode's note", rep.Notes)
	}
}
