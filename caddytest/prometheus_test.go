package caddytest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// promQuery is one query of the dashboard (a panel's target) or an alert's
// expression.
type promQuery struct {
	name, expr string
}

// dashboardVariables reads the dashboard's query variables: name →
// Grafana's label_values(<selector>, <label>) split into selector and
// label.
func dashboardVariables(t *testing.T) map[string][2]string {
	t.Helper()
	raw, err := os.ReadFile("../observability/sluice-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^label_values\((.+), (\w+)\)$`)
	out := map[string][2]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := re.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Fatalf("variable %s: %q is not label_values(<selector>, <label>)", v.Name, v.Definition)
		}
		out[v.Name] = [2]string{m[1], m[2]}
	}
	return out
}

// dashboardQueries reads every panel target of observability's dashboard,
// its variables substituted as Grafana would for the given instance and
// zones (a multi-value variable becomes a regex alternation) and
// $__rate_interval as rate.
func dashboardQueries(t *testing.T, instance string, zones []string, rate string) []promQuery {
	t.Helper()
	raw, err := os.ReadFile("../observability/sluice-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	r := strings.NewReplacer("$__rate_interval", rate, "$instance", strings.ReplaceAll(regexp.QuoteMeta(instance), `\`, `\\`), "$zone", "("+strings.Join(zones, "|")+")")
	var out []promQuery
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out = append(out, promQuery{name: p.Title + " " + tg.RefID, expr: r.Replace(tg.Expr)})
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d dashboard queries read", len(out))
	}
	if v := regexp.MustCompile(`\$\w+`).FindString(strings.Join(exprs(out), "\n")); v != "" {
		t.Fatalf("a dashboard query keeps the variable %s after substitution", v)
	}
	return out
}

func exprs(qs []promQuery) []string {
	var s []string
	for _, q := range qs {
		s = append(s, q.expr)
	}
	return s
}

// alertRules reads observability's alert rules by name and writes the
// test copy Prometheus loads: the same rules, every `for:` 0s, so an alert
// fires at its first evaluation where the expression holds.
func alertRules(t *testing.T, dir string) (map[string]string, string) {
	t.Helper()
	raw, err := os.ReadFile("../observability/sluice-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				m[r.Alert] = r.Expr
			}
		}
	}
	noFor := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAll(raw, []byte("$1 0s"))
	path := filepath.Join(dir, "sluice-alerts.yml")
	if err := os.WriteFile(path, noFor, 0o644); err != nil {
		t.Fatal(err)
	}
	return m, path
}

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
	srv := redistest.Start(t)
	up := newPromUpstream(t, "adaptive", "store")
	tc := newTester(t)
	zones := map[string]string{}
	var zoneList []string
	for _, z := range []string{"MEM", "DYN", "DELAY", "CONC", "ADAPT", "SETTLE", "RDENY", "RLOCAL", "RCOUNT", "RCONC"} {
		zones[z] = zoneName("prom_" + strings.ToLower(z))
		zoneList = append(zoneList, zones[z])
	}
	store := `store redis @URL@ {
				timeout 500ms
				breaker {
					failures 3
					cooldown 500ms
					max_cooldown 1s
				}
			}`
	sites := strings.NewReplacer("@STORE@", store).Replace(`http://localhost:@A@ {
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
`)
	vars := []string{"URL", srv.URL(), "UP", up.Listener.Addr().String()}
	for k, v := range zones {
		vars = append(vars, k, v)
	}
	load(t, tc, config("", sites, vars...))

	dir := t.TempDir()
	alerts, rulesPath := alertRules(t, dir)
	instance := "127.0.0.1:" + strconv.Itoa(adminPort)
	prom := startPrometheus(t, dir, fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: caddy
    static_configs:
      - targets: ['%s']
`, rulesPath, instance))

	// ours keeps the series of this test: its instance, zones, Redis.
	target, node := srv.URL(), srv.Addr
	ourZones := map[string]bool{}
	for _, z := range zoneList {
		ourZones[z] = true
	}
	ours := func(l map[string]string) bool {
		if v, ok := l["instance"]; ok && v != instance {
			return false
		}
		if v, ok := l["zone"]; ok && !ourZones[v] {
			return false
		}
		if v, ok := l["target"]; ok && v != target {
			return false
		}
		if v, ok := l["node"]; ok && v != node {
			return false
		}
		return true
	}

	// Bounded load: 4 workers over the paths (worker 0 alone on /adaptive,
	// so at most one request of it is in flight and its limit stays at its
	// minimum), until stopped, 60 s or 30000 requests.
	c := loopbackClient(64)
	stop := make(chan struct{})
	var sent atomic.Int64
	var adaptivePaused atomic.Bool
	var wg sync.WaitGroup
	paths := []string{"/mem", "/dyn", "/delay", "/conc", "/settle", "/rdeny", "/rlocal", "/rcount", "/rconc"}
	loadEnd := time.Now().Add(60 * time.Second)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(loadEnd) && sent.Add(1) <= 30000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				path := paths[(i+w)%len(paths)]
				if w == 0 && i%2 == 0 && !adaptivePaused.Load() {
					path = "/adaptive"
				}
				req, _ := http.NewRequest(http.MethodGet, siteA+path, nil)
				req.Header.Set("X-User", "u"+strconv.Itoa(i%3)+"-"+nonce)
				if i%2 == 0 {
					req.Header.Set("X-Events", "bogus")
				}
				if resp, err := c.Do(req); err == nil {
					resp.Body.Close()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopLoad)

	// A burst on /delay: 40 requests wait their turn; 20 more give up
	// after 100 ms while waiting (abandoned). A second burst follows if
	// the first did not show (a series it created shows no increase).
	burst := func() {
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
				if resp, err := c.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		}
		bw.Wait()
	}
	burst()

	panels := dashboardQueries(t, instance, zoneList, "10s")
	seen := map[string]bool{}
	// evaluate runs every panel query (each must evaluate) and every alert
	// expression, and returns the alerts whose expression holds for us.
	evaluate := func() map[string]bool {
		for _, q := range panels {
			res, err := prom.query(q.expr)
			if err != nil {
				t.Fatalf("panel %q: Prometheus refused the query: %v\n%s", q.name, err, q.expr)
			}
			if positive(res, ours) {
				seen[q.name] = true
			}
		}
		firing := map[string]bool{}
		for name, expr := range alerts {
			res, err := prom.query(expr)
			if err != nil {
				t.Fatalf("alert %s: Prometheus refused the expression: %v\n%s", name, err, expr)
			}
			if anyOurs(res, ours) {
				firing[name] = true
			}
		}
		return firing
	}
	// seeBurst evaluates until the burst's waits show (a scrape or two
	// after it), at most 15 s: the last check reports what never did.
	seeBurst := func() bool {
		for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
			evaluate()
			if seen["Wait time A"] && seen["Delayed and abandoned A"] && seen["Delayed and abandoned B"] {
				return true
			}
		}
		return false
	}
	shown := seeBurst()
	// until evaluates every second until every alert of want holds, or
	// limit passes; it returns the last evaluation.
	until := func(phase string, limit time.Duration, want ...string) map[string]bool {
		deadline := time.Now().Add(limit)
		for {
			firing := evaluate()
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
				t.Fatalf("%s: after %v the expressions of %v still return no series of this test (holding: %v); Prometheus's log:\n%s", phase, limit, missing, firing, prom.logTail())
			}
			time.Sleep(time.Second)
		}
	}

	// Healthy: the zones refusing with no history (SluiceRefusalRatioJump)
	// and the settle zone's missing usage fire; the store's alerts stay
	// quiet, and so does SluiceAdaptiveAtMinimum: the adaptive zone sits at
	// its minimum (one request in flight never grows it) but refuses none.
	firing := until("healthy", 30*time.Second, "SluiceRefusalRatioJump", "SluiceSettleUsageMissing")
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(time.Second) {
		res, err := prom.query(`caddy_rate_limit_adaptive_limit{zone="` + zones["ADAPT"] + `"}`)
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
	firing = evaluate()
	for _, quiet := range []string{"SluiceStoreFailing", "SluiceBreakerOpen", "SluiceUnknownDecisions", "SluiceRefundsLost", "SluiceStoreDataLost", "SluiceStoreEvictions", "SluiceAdaptiveAtMinimum"} {
		if firing[quiet] {
			t.Errorf("healthy: the expression of %s holds while all is well", quiet)
		}
	}
	res, err := prom.query(alerts["SluiceRefusalRatioJump"])
	if err != nil || !strings.Contains(zonesOf(res), zones["MEM"]) {
		t.Errorf("SluiceRefusalRatioJump: want zone %s (three keys over their limit) among %s (%v)", zones["MEM"], zonesOf(res), err)
	}
	t.Logf("healthy: alert expressions holding: %v", firing)

	// The adaptive zone's 4 places held in the upstream, the load's
	// requests to it paused first (one ending while the places are held
	// would be a sample that grows the limit): it refuses at its minimum
	// the requests sent to it every 100 ms.
	adaptivePaused.Store(true)
	waitAdaptiveIdle(t, zones["ADAPT"])
	up.hold(t, c, "adaptive", 4, "/adaptive", "/adaptive", "/adaptive", "/adaptive")
	probeStop := make(chan struct{})
	var refusedProbes atomic.Int64
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
			if resp, err := c.Get(siteA + "/adaptive"); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					refusedProbes.Add(1)
				}
			}
		}
	}()
	until("adaptive zone full", 30*time.Second, "SluiceAdaptiveAtMinimum")
	close(probeStop)
	probes.Wait()
	if got := jsonInt(t, adaptiveListing(t, zones["ADAPT"]), "limit"); got != 4 || refusedProbes.Load() == 0 {
		t.Errorf("adaptive zone full: limit %d, %d requests refused; want 4 and some", got, refusedProbes.Load())
	}
	close(up.holds["adaptive"].release)
	adaptivePaused.Store(false)

	// Redis restarts empty: the store's watch sees a new run_id.
	if !shown {
		burst()
		seeBurst()
	}
	srv.Restart(t)
	until("restarted", 30*time.Second, "SluiceStoreDataLost")

	// Redis evicts keys for memory: an LRU policy, a bound 1 MB above its
	// use and 3 MB written; then unbounded again.
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
	until("evicted", 30*time.Second, "SluiceStoreEvictions")

	// Redis frozen (accepts, never answers), with requests of the count
	// and the Redis concurrency zones held in the upstream: their refund and
	// their slot's release cannot reach Redis (a release is given up once
	// its 2 s lease would have expired).
	up.hold(t, c, "store", 4, "/rcount", "/rcount", "/rconc", "/rconc")
	srv.Freeze(t)
	t.Cleanup(func() { srv.Thaw(t) })
	close(up.holds["store"].release)
	until("frozen", 45*time.Second, "SluiceStoreFailing", "SluiceBreakerOpen", "SluiceUnknownDecisions", "SluiceRefundsLost")
	// The same alerts fire in Prometheus itself (the rules with for: 0s).
	firingBy := time.Now().Add(15 * time.Second)
	for {
		states, err := prom.alertStates(ours)
		if err != nil {
			t.Fatal(err)
		}
		if states["SluiceStoreFailing"] == "firing" && states["SluiceBreakerOpen"] == "firing" {
			t.Logf("frozen: Prometheus's alerts: %v", states)
			break
		}
		if time.Now().After(firingBy) {
			t.Fatalf("frozen: Prometheus's alerts %v: want SluiceStoreFailing and SluiceBreakerOpen firing", states)
		}
		time.Sleep(time.Second)
	}

	// Every panel query shows a positive value of ours in some phase,
	// except those the scenario cannot produce: evaluated until each did
	// (the frozen phase's counters reach Prometheus a scrape or two later).
	notProduced := map[string]string{
		"Unknown, late and unsent decisions B": "a late reply needs Redis to answer between timeout and the grace (it may)",
		"Unknown, late and unsent decisions C": "an unsent timeout needs the pipelines busy past the timeout",
		"Waiting now A":                        "a gauge that is 0 between bursts",
	}
	pending := func() []promQuery {
		var out []promQuery
		for _, q := range panels {
			if _, skip := notProduced[q.name]; !skip && !seen[q.name] {
				out = append(out, q)
			}
		}
		return out
	}
	for end := time.Now().Add(20 * time.Second); len(pending()) > 0 && time.Now().Before(end); {
		time.Sleep(time.Second)
		evaluate()
	}
	stopLoad()
	t.Logf("requests sent: %d", sent.Load())
	for _, q := range pending() {
		res, _ := prom.query(q.expr)
		t.Errorf("panel %q: never a positive value of this test's zones or Redis; now %s\n%s", q.name, zonesOf(res), q.expr)
	}
	for _, q := range panels {
		if why, skip := notProduced[q.name]; skip && seen[q.name] {
			t.Logf("panel %q: positive, though listed as not produced (%s)", q.name, why)
		}
	}
	for name := range notProduced {
		found := false
		for _, q := range panels {
			found = found || q.name == name
		}
		if !found {
			t.Errorf("notProduced names %q, which is no dashboard query", name)
		}
	}

	// The dashboard's variables list this test's instance and zones.
	dashVars := dashboardVariables(t)
	for name, want := range map[string][]string{"instance": {instance}, "zone": zoneList} {
		v, ok := dashVars[name]
		if !ok {
			t.Fatalf("the dashboard has no variable %s", name)
		}
		match := strings.ReplaceAll(v[0], "$instance", strings.ReplaceAll(regexp.QuoteMeta(instance), `\`, `\\`))
		got, err := prom.labelValues(v[1], match)
		if err != nil {
			t.Fatalf("variable %s: %v", name, err)
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("variable %s (label_values(%s, %s)) lists %v, not %s", name, match, v[1], got, w)
			}
		}
	}

	health, err := prom.ruleHealth()
	if err != nil {
		t.Fatal(err)
	}
	if len(health) != len(alerts) {
		t.Errorf("Prometheus loaded %d rules, the file has %d alerts", len(health), len(alerts))
	}
	for name, h := range health {
		if !strings.HasPrefix(h, "ok") {
			t.Errorf("rule %s: health %q", name, h)
		}
	}

}
