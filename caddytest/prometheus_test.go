package caddytest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// promUpstream stands in for the application: /slow answers after 100 ms,
// or with X-Hold: <name> once that hold is released; /usage reports
// X-Usage 7 on every other response and nothing on the rest.
type promUpstream struct {
	*httptest.Server
	usage atomic.Int64
	holds map[string]*promHold
}

// promHold holds requests in the upstream until release is closed.
type promHold struct {
	held    atomic.Int64
	release chan struct{}
}

func newPromUpstream(t *testing.T, holds ...string) *promUpstream {
	u := &promUpstream{holds: map[string]*promHold{}}
	for _, h := range holds {
		u.holds[h] = &promHold{release: make(chan struct{})}
	}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			if h := u.holds[r.Header.Get("X-Hold")]; h != nil {
				h.held.Add(1)
				select {
				case <-h.release:
				case <-time.After(30 * time.Second):
				}
			} else {
				time.Sleep(100 * time.Millisecond)
			}
		case "/usage":
			if u.usage.Add(1)%2 == 0 {
				w.Header().Set("X-Usage", "7")
			}
		}
		w.Write([]byte("ok"))
	}))
	t.Cleanup(func() {
		for _, h := range u.holds {
			select {
			case <-h.release:
			default:
				close(h.release)
			}
		}
		u.Close()
	})
	return u
}

// hold sends a request to each of paths with X-Hold: name through c, and
// another to the first path every 200 ms while the upstream holds fewer
// than need more (one may be refused while the load's request runs); it
// returns once the upstream holds them.
func (u *promUpstream) hold(t *testing.T, c *http.Client, name string, need int, paths ...string) {
	t.Helper()
	h := u.holds[name]
	want := h.held.Load() + int64(need)
	send := func(path string) {
		go func() {
			req, _ := http.NewRequest(http.MethodGet, siteA+path, nil)
			req.Header.Set("X-Hold", name)
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	for _, path := range paths {
		send(path)
	}
	end := time.Now().Add(10 * time.Second)
	for next := time.Now().Add(200 * time.Millisecond); h.held.Load() < want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("hold %s: %d of %d requests reached the upstream in 10s", name, h.held.Load(), want)
		}
		if time.Now().After(next) {
			send(paths[0])
			next = time.Now().Add(200 * time.Millisecond)
		}
	}
}

// promStore is the Redis store of the scenario's Redis zones.
const promStore = `store redis @URL@ {
				timeout 500ms
				breaker {
					failures 3
					cooldown 500ms
					max_cooldown 1s
				}
			}`

// promSites is the scenario's site: memory zones of every kind (rate,
// per-request events, delay, concurrency, adaptive, settle) and Redis
// zones (deny cache, local allowance, count, concurrency), each on a path.
const promSites = `http://localhost:@A@ {
	handle /mem {
		rate_limit {
			zone @MEM@ {
				key {http.request.header.X-User}
				events 5
				window 1m
			}
		}
		respond "ok"
	}
	handle /dyn {
		rate_limit {
			zone @DYN@ {
				key static
				events {http.request.header.X-Events} 1000000
				window 1m
			}
		}
		respond "ok"
	}
	handle /delay {
		rate_limit {
			zone @DELAY@ {
				key static
				events 20
				window 1s
				delay 3s
			}
		}
		respond "ok"
	}
	handle /conc {
		rate_limit {
			zone @CONC@ {
				key static
				concurrent 100
			}
		}
		rewrite * /slow
		reverse_proxy @UP@
	}
	handle /adaptive {
		rate_limit {
			zone @ADAPT@ {
				key static
				concurrent adaptive {
					minimum 4
					initial 4
					maximum 100
				}
			}
		}
		rewrite * /slow
		reverse_proxy @UP@
	}
	handle /settle {
		rate_limit {
			zone @SETTLE@ {
				key static
				events 1000000
				window 1m
				cost 10
				settle header X-Usage
			}
		}
		rewrite * /usage
		reverse_proxy @UP@
	}
	handle /rdeny {
		rate_limit {
			zone @RDENY@ {
				key {http.request.header.X-User}
				events 5
				window 1h
				fail open
			}
			@STORE@
		}
		respond "ok"
	}
	handle /rlocal {
		rate_limit {
			zone @RLOCAL@ {
				key static
				events 1000000
				window 1h
				local_allowance
				fail open
			}
			@STORE@
		}
		respond "ok"
	}
	handle /rcount {
		rate_limit {
			zone @RCOUNT@ {
				key static
				events 1000000
				window 1h
				count 5xx
				fail open
			}
			@STORE@
		}
		rewrite * /slow
		reverse_proxy @UP@
	}
	handle /rsync {
		rate_limit {
			zone @RSYNC@ {
				key {http.request.header.X-User}
				events 1000000
				window 1h
				algorithm fixed_window
				sync 100ms
			}
			@STORE@
		}
		respond "ok"
	}
	handle /rconc {
		rate_limit {
			zone @RCONC@ {
				key static
				concurrent 1000
				lease 2s
				fail open
			}
			@STORE@
		}
		rewrite * /slow
		reverse_proxy @UP@
	}
}
`

// promZones are the scenario's zones, by their variable in promSites.
var promZones = []string{"MEM", "DYN", "DELAY", "CONC", "ADAPT", "SETTLE", "RDENY", "RLOCAL", "RCOUNT", "RCONC", "RSYNC"}

// promScenario is TestPrometheusDashboardAndAlerts's world: Redis, the
// upstream, the loaded config, Prometheus scraping this process's Caddy,
// the dashboard's queries and the alerts' expressions.
type promScenario struct {
	t        *testing.T
	srv      *redistest.Server
	up       *promUpstream
	prom     *promServer
	c        *http.Client
	zones    map[string]string // by their variable in promSites
	zoneList []string
	instance string            // Prometheus's scrape target: the admin endpoint
	alerts   map[string]string // each alert's expression
	panels   []promQuery
	seen     map[string]bool // panel queries that showed a positive value of ours
	sent     atomic.Int64    // requests of the load
	// adaptivePaused keeps the load off /adaptive while its places are held.
	adaptivePaused atomic.Bool
}

func newPromScenario(t *testing.T) *promScenario {
	s := &promScenario{t: t, srv: redistest.Start(t), up: newPromUpstream(t, "adaptive", "store"), c: loopbackClient(64),
		zones: map[string]string{}, seen: map[string]bool{}, instance: "127.0.0.1:" + strconv.Itoa(adminPort)}
	tc := newTester(t)
	vars := []string{"URL", s.srv.URL(), "UP", s.up.Listener.Addr().String()}
	for _, z := range promZones {
		s.zones[z] = zoneName("prom_" + strings.ToLower(z))
		s.zoneList = append(s.zoneList, s.zones[z])
		vars = append(vars, z, s.zones[z])
	}
	load(t, tc, config("", strings.ReplaceAll(promSites, "@STORE@", promStore), vars...))
	// An override in force, for the overrides panel (read by the sweep).
	if code, body := adminSend(t, "PUT", "/rate_limit/zones/"+s.zones["RDENY"]+"/overrides/vip-"+nonce,
		`{"events": 100, "window": "1h", "expires_in": "1h", "reason": "prometheus test"}`); code != http.StatusOK {
		t.Fatalf("setting an override: %d %v", code, body)
	}
	dir := t.TempDir()
	alerts, rulesPath := alertRules(t, dir)
	s.alerts = alerts
	s.prom = startPrometheus(t, dir, fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: caddy
    static_configs:
      - targets: ['%s']
`, rulesPath, s.instance))
	s.panels = dashboardQueries(t, s.instance, s.zoneList, "10s")
	return s
}

// TestPrometheusDashboardAndAlerts (issue 40): a real Prometheus scrapes
// this process's Caddy (memory zones of every kind and Redis zones) under
// bounded load; every dashboard query and every alert expression is
// evaluated through Prometheus's HTTP API. Each panel query returns a
// positive value of this test's zones or Redis in some phase (except the
// few the scenario cannot produce, listed). While all is well, the
// refusal and settle alerts hold and the others are quiet (the adaptive
// zone at its minimum but refusing none); SluiceAdaptiveAtMinimum fires
// once the zone's places are held; SluiceStoreDataLost once Redis restarts
// empty; SluiceStoreEvictions once it evicts; the store alerts once Redis is frozen (their expressions, and the
// test copy of the rules with for: 0s in /api/v1/alerts). The dashboard's
// variables list the test's instance and zones.
func TestPrometheusDashboardAndAlerts(t *testing.T) {
	s := newPromScenario(t)
	stopLoad := s.startLoad()
	t.Cleanup(stopLoad)
	s.burst()
	shown := s.seeBurst()
	s.healthy()
	s.fillAdaptive()
	if !shown {
		s.burst()
		s.seeBurst()
	}
	s.restartRedis()
	s.evictRedis()
	s.freezeRedis()
	s.awaitPanels()
	stopLoad()
	t.Logf("requests sent: %d", s.sent.Load())
	s.checkPanels()
	s.checkVariables()
	s.checkRules()
}

// ours keeps the series of this test: its instance, zones, Redis.
func (s *promScenario) ours(l map[string]string) bool {
	if v, ok := l["instance"]; ok && v != s.instance {
		return false
	}
	if v, ok := l["zone"]; ok && !slices.Contains(s.zoneList, v) {
		return false
	}
	if v, ok := l["target"]; ok && v != s.srv.URL() {
		return false
	}
	if v, ok := l["node"]; ok && v != s.srv.Addr {
		return false
	}
	return true
}

// startLoad starts the bounded load: 4 workers over the paths (worker 0
// alone on /adaptive, so at most one request of it is in flight and its
// limit stays at its minimum), until stopped, 60 s or 30000 requests.
func (s *promScenario) startLoad() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	paths := []string{"/mem", "/dyn", "/delay", "/conc", "/settle", "/rdeny", "/rlocal", "/rcount", "/rconc", "/rsync"}
	end := time.Now().Add(60 * time.Second)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(end) && s.sent.Add(1) <= 30000; i++ {
				select {
				case <-done:
					return
				default:
				}
				path := paths[(i+w)%len(paths)]
				if w == 0 && i%2 == 0 && !s.adaptivePaused.Load() {
					path = "/adaptive"
				}
				req, _ := http.NewRequest(http.MethodGet, siteA+path, nil)
				req.Header.Set("X-User", "u"+strconv.Itoa(i%3)+"-"+nonce)
				if i%2 == 0 {
					req.Header.Set("X-Events", "bogus")
				}
				if resp, err := s.c.Do(req); err == nil {
					resp.Body.Close()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	return sync.OnceFunc(func() { close(done); wg.Wait() })
}

// burst sends 60 requests at once to /delay: 40 wait their turn; 20 more
// give up after 100 ms while waiting (abandoned).
func (s *promScenario) burst() {
	var bw sync.WaitGroup
	for i := range 60 {
		bw.Add(1)
		go func() {
			defer bw.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if i >= 40 {
				time.Sleep(20 * time.Millisecond)
				ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
			}
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, siteA+"/delay", nil)
			if resp, err := s.c.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	bw.Wait()
}

// seeBurst evaluates until the burst's waits show (a scrape or two after
// it), at most 15 s, and reports whether they did (a series the burst
// created shows no increase: the test bursts again).
func (s *promScenario) seeBurst() bool {
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		s.evaluate()
		if s.seen["Wait time A"] && s.seen["Delayed and abandoned A"] && s.seen["Delayed and abandoned B"] {
			return true
		}
	}
	return false
}

// evaluate runs every panel query (each must evaluate) and every alert
// expression, and returns the alerts whose expression holds for us.
func (s *promScenario) evaluate() map[string]bool {
	t := s.t
	for _, q := range s.panels {
		res, err := s.prom.query(q.expr)
		if err != nil {
			t.Fatalf("panel %q: Prometheus refused the query: %v\n%s", q.name, err, q.expr)
		}
		if positive(res, s.ours) {
			s.seen[q.name] = true
		}
	}
	firing := map[string]bool{}
	for name, expr := range s.alerts {
		res, err := s.prom.query(expr)
		if err != nil {
			t.Fatalf("alert %s: Prometheus refused the expression: %v\n%s", name, err, expr)
		}
		if anyOurs(res, s.ours) {
			firing[name] = true
		}
	}
	return firing
}

// until evaluates every second until every alert of want holds, or limit
// passes; it returns the last evaluation.
func (s *promScenario) until(phase string, limit time.Duration, want ...string) map[string]bool {
	deadline := time.Now().Add(limit)
	for {
		firing := s.evaluate()
		missing := []string{}
		for _, w := range want {
			if !firing[w] {
				missing = append(missing, w)
			}
		}
		if len(missing) == 0 {
			return firing
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: after %v the expressions of %v still return no series of this test (holding: %v); Prometheus's log:\n%s", phase, limit, missing, firing, s.prom.logTail())
		}
		time.Sleep(time.Second)
	}
}

// healthy: the zones refusing with no history (SluiceRefusalRatioJump) and
// the settle zone's missing usage fire; the store's alerts stay quiet, and
// so does SluiceAdaptiveAtMinimum: the adaptive zone sits at its minimum
// (one request in flight never grows it) but refuses none.
func (s *promScenario) healthy() {
	t := s.t
	s.until("healthy", 30*time.Second, "SluiceRefusalRatioJump", "SluiceSettleUsageMissing")
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(time.Second) {
		res, err := s.prom.query(`caddy_rate_limit_adaptive_limit{zone="` + s.zones["ADAPT"] + `"}`)
		if err != nil {
			t.Fatal(err)
		}
		if len(res) == 1 && res[0].value == 4 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("healthy: the adaptive zone's limit in Prometheus is %s, want its minimum 4", zonesOf(res))
		}
	}
	firing := s.evaluate()
	for _, quiet := range []string{"SluiceStoreFailing", "SluiceBreakerOpen", "SluiceUnknownDecisions", "SluiceRefundsLost", "SluiceStoreDataLost", "SluiceStoreEvictions", "SluiceAdaptiveAtMinimum", "SluiceSyncFailing"} {
		if firing[quiet] {
			t.Errorf("healthy: the expression of %s holds while all is well", quiet)
		}
	}
	res, err := s.prom.query(s.alerts["SluiceRefusalRatioJump"])
	if err != nil || !strings.Contains(zonesOf(res), s.zones["MEM"]) {
		t.Errorf("SluiceRefusalRatioJump: want zone %s (three keys over their limit) among %s (%v)", s.zones["MEM"], zonesOf(res), err)
	}
	t.Logf("healthy: alert expressions holding: %v", firing)
}

// fillAdaptive holds the adaptive zone's 4 places in the upstream, the
// load's requests to it paused first (one ending while the places are held
// would be a sample that grows the limit): SluiceAdaptiveAtMinimum fires as
// the zone refuses, at its minimum, the requests sent to it every 100 ms.
func (s *promScenario) fillAdaptive() {
	t := s.t
	s.adaptivePaused.Store(true)
	waitAdaptiveIdle(t, s.zones["ADAPT"])
	s.up.hold(t, s.c, "adaptive", 4, "/adaptive", "/adaptive", "/adaptive", "/adaptive")
	probeStop := make(chan struct{})
	var refused atomic.Int64
	var probes sync.WaitGroup
	probes.Add(1)
	go func() {
		defer probes.Done()
		for {
			select {
			case <-probeStop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if resp, err := s.c.Get(siteA + "/adaptive"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					refused.Add(1)
				}
			}
		}
	}()
	s.until("adaptive zone full", 30*time.Second, "SluiceAdaptiveAtMinimum")
	close(probeStop)
	probes.Wait()
	if got := jsonInt(t, adaptiveListing(t, s.zones["ADAPT"]), "limit"); got != 4 || refused.Load() == 0 {
		t.Errorf("adaptive zone full: limit %d, %d requests refused; want 4 and some", got, refused.Load())
	}
	close(s.up.holds["adaptive"].release)
	s.adaptivePaused.Store(false)
}

// restartRedis restarts Redis empty: the store's watch sees a new run_id
// and SluiceStoreDataLost fires.
func (s *promScenario) restartRedis() {
	s.srv.Restart(s.t)
	s.until("restarted", 30*time.Second, "SluiceStoreDataLost")
}

// evictRedis makes Redis evict keys for memory (an LRU policy, a bound
// 1 MB above its use and 3 MB written; then unbounded again):
// SluiceStoreEvictions fires.
func (s *promScenario) evictRedis() {
	t, srv := s.t, s.srv
	used, err := strconv.ParseInt(srv.Info(t, "memory")["used_memory"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	srv.Do(t, "CONFIG", "SET", "maxmemory", strconv.FormatInt(used+1<<20, 10))
	junk := strings.Repeat("x", 16<<10)
	for i := range 200 {
		srv.Do(t, "SET", "prom:evict:"+strconv.Itoa(i), junk)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	if n := srv.Info(t, "stats")["evicted_keys"]; n == "0" || n == "" {
		t.Fatalf("Redis evicted no key (evicted_keys %q)", n)
	}
	s.until("evicted", 30*time.Second, "SluiceStoreEvictions")
}

// freezeRedis freezes Redis (it accepts, never answers) with requests of
// the count and the Redis concurrency zones held in the upstream: their
// refund and their slot's release cannot reach Redis (a release is given
// up once its 2 s lease would have expired). The store's alerts fire, as
// expressions and in Prometheus itself (the rules with for: 0s).
func (s *promScenario) freezeRedis() {
	t := s.t
	s.up.hold(t, s.c, "store", 4, "/rcount", "/rcount", "/rconc", "/rconc")
	s.srv.Freeze(t)
	t.Cleanup(func() { s.srv.Thaw(t) })
	close(s.up.holds["store"].release)
	s.until("frozen", 45*time.Second, "SluiceStoreFailing", "SluiceBreakerOpen", "SluiceUnknownDecisions", "SluiceRefundsLost")
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(time.Second) {
		states, err := s.prom.alertStates(s.ours)
		if err != nil {
			t.Fatal(err)
		}
		if states["SluiceStoreFailing"] == "firing" && states["SluiceBreakerOpen"] == "firing" {
			t.Logf("frozen: Prometheus's alerts: %v", states)
			return
		}
		if time.Now().After(end) {
			t.Fatalf("frozen: Prometheus's alerts %v: want SluiceStoreFailing and SluiceBreakerOpen firing", states)
		}
	}
}

// promNotProduced are the panel queries the scenario cannot make positive.
var promNotProduced = map[string]string{
	"Unknown, late and unsent decisions B": "a late reply needs Redis to answer between timeout and the grace (it may)",
	"Unknown, late and unsent decisions C": "an unsent timeout needs the pipelines busy past the timeout",
	"Waiting now A":                        "a gauge that is 0 between bursts",
	"Asynchronous mode syncs B":            "units dropped unsent need more keys than the zone's max_keys during an outage",
}

// pending returns the panel queries that have not shown a positive value
// of ours yet, those of promNotProduced aside.
func (s *promScenario) pending() []promQuery {
	var out []promQuery
	for _, q := range s.panels {
		if _, skip := promNotProduced[q.name]; !skip && !s.seen[q.name] {
			out = append(out, q)
		}
	}
	return out
}

// awaitPanels evaluates until every panel query showed a positive value,
// at most 20 s (the frozen phase's counters reach Prometheus a scrape or
// two later).
func (s *promScenario) awaitPanels() {
	for end := time.Now().Add(20 * time.Second); len(s.pending()) > 0 && time.Now().Before(end); {
		time.Sleep(time.Second)
		s.evaluate()
	}
}

// checkPanels: every panel query showed a positive value of ours in some
// phase, except those the scenario cannot produce.
func (s *promScenario) checkPanels() {
	t := s.t
	for _, q := range s.pending() {
		res, _ := s.prom.query(q.expr)
		t.Errorf("panel %q: never a positive value of this test's zones or Redis; now %s\n%s", q.name, zonesOf(res), q.expr)
	}
	for name, why := range promNotProduced {
		found := false
		for _, q := range s.panels {
			found = found || q.name == name
		}
		switch {
		case !found:
			t.Errorf("promNotProduced names %q, which is no dashboard query", name)
		case s.seen[name]:
			t.Logf("panel %q: positive, though listed as not produced (%s)", name, why)
		}
	}
}

// checkVariables: the dashboard's variables list this test's instance and
// zones.
func (s *promScenario) checkVariables() {
	t := s.t
	dashVars := dashboardVariables(t)
	for name, want := range map[string][]string{"instance": {s.instance}, "zone": s.zoneList} {
		v, ok := dashVars[name]
		if !ok {
			t.Fatalf("the dashboard has no variable %s", name)
		}
		match := strings.ReplaceAll(v[0], "$instance", strings.ReplaceAll(regexp.QuoteMeta(s.instance), `\`, `\\`))
		got, err := s.prom.labelValues(v[1], match)
		if err != nil {
			t.Fatalf("variable %s: %v", name, err)
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("variable %s (label_values(%s, %s)) lists %v, not %s", name, match, v[1], got, w)
			}
		}
	}
}

// checkRules: Prometheus loaded every alert of the file and evaluates each
// without error.
func (s *promScenario) checkRules() {
	t := s.t
	health, err := s.prom.ruleHealth()
	if err != nil {
		t.Fatal(err)
	}
	if len(health) != len(s.alerts) {
		t.Errorf("Prometheus loaded %d rules, the file has %d alerts", len(health), len(s.alerts))
	}
	for name, h := range health {
		if !strings.HasPrefix(h, "ok") {
			t.Errorf("rule %s: health %q", name, h)
		}
	}
}
