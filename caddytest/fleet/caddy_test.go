package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

const (
	// readyTimeout bounds a Caddy start: until GET /__ready answers.
	readyTimeout = 15 * time.Second
	// stopGrace is how long a Caddy has to exit after SIGTERM before it is
	// killed (after its goroutines are read, see stop).
	stopGrace = 5 * time.Second
	// startAttempts: a port picked free may be taken before Caddy binds it.
	startAttempts = 3
)

// caddyProc is one Caddy process running the binary built by TestMain.
type caddyProc struct {
	name      string
	adminPort int
	httpPort  int
	dir       string
	logPath   string
	cmd       *exec.Cmd
	done      chan struct{} // closed when the process has exited
	waitErr   error
	dumped    bool   // stop had to read the goroutines of a Caddy that did not exit
	dump      string // what it read

	stopOnce sync.Once
}

// siteTemplate is the Caddyfile of every process: the global options the
// fleet needs, extra global options, and one HTTP site whose /__ready path
// answers without going through the test's routes (so waiting for a start
// never touches the limiter).
const siteTemplate = `{
	admin 127.0.0.1:%d
	persist_config off
	auto_https off
	default_bind 127.0.0.1
%s
}

http://:%d {
	handle /__ready {
		respond "ready" 200
	}
	handle {
%s
	}
}
`

// render returns the Caddyfile of p with the given extra global options and
// site routes.
func (p *caddyProc) render(global, routes string) string {
	return fmt.Sprintf(siteTemplate, p.adminPort, indent(global, "\t"), p.httpPort, indent(routes, "\t\t"))
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.Trim(s, "\n"), "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "\n")
}

// startCaddy starts a Caddy process with the given extra global options and
// site routes (the body of the site's catch-all handle block), waits until
// it serves HTTP, and stops it at t's cleanup. On a failed test the tail of
// its log is printed.
func startCaddy(t testing.TB, name, global, routes string) *caddyProc {
	t.Helper()
	var lastErr error
	var last *caddyProc
	for attempt := 1; attempt <= startAttempts; attempt++ {
		p := &caddyProc{name: name, adminPort: redistest.FreePort(t), httpPort: redistest.FreePort(t), dir: t.TempDir()}
		err := p.launch(p.render(global, routes))
		if err == nil {
			t.Cleanup(func() {
				t0 := time.Now()
				p.stop()
				if d := time.Since(t0); d > time.Second {
					t.Logf("caddy %s took %v to stop", p.name, d.Round(time.Millisecond))
				}
				if t.Failed() {
					t.Logf("caddy %s (admin %d, http %d) log tail:\n%s", p.name, p.adminPort, p.httpPort, p.logTail(60))
				}
				if p.dumped {
					t.Logf("caddy %s did not exit within %v of SIGTERM; its goroutines then:\n%s", p.name, stopGrace, p.goroutineDump())
				}
			})
			return p
		}
		p.stop()
		lastErr, last = err, p
		if !strings.Contains(p.logText(), "address already in use") {
			break
		}
	}
	t.Fatalf("caddy %s: start failed: %v\nlog tail:\n%s", name, lastErr, last.logTail(60))
	return nil
}

func (p *caddyProc) launch(caddyfile string) error {
	cfgPath := filepath.Join(p.dir, "Caddyfile")
	if err := os.WriteFile(cfgPath, []byte(caddyfile), 0o644); err != nil {
		return err
	}
	p.logPath = filepath.Join(p.dir, "caddy.log")
	logf, err := os.Create(p.logPath)
	if err != nil {
		return err
	}
	xdgConfig, xdgData := filepath.Join(p.dir, "config"), filepath.Join(p.dir, "data")
	cmd := exec.Command(caddyBin, "run", "--config", cfgPath, "--adapter", "caddyfile")
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(),
		"XDG_CONFIG_HOME="+xdgConfig,
		"XDG_DATA_HOME="+xdgData,
		"HOME="+p.dir,
	)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	p.cmd = cmd
	p.done = make(chan struct{})
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	return p.waitReady(readyTimeout)
}

// waitReady polls GET /__ready until it answers 200, the process exits, or
// timeout passes.
func (p *caddyProc) waitReady(timeout time.Duration) error {
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(timeout)
	var last error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("caddy exited during start-up (%v)", p.waitErr)
		default:
		}
		resp, err := c.Get(p.url("/__ready"))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		if time.Now().After(deadline) {
			return fmt.Errorf("GET /__ready not answered within %v: %v", timeout, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the exit. A Caddy still running after
// stopGrace is asked for its goroutines (the admin endpoint's
// /debug/pprof/goroutine, still served while the apps stop: a shutdown
// that hangs says where) and killed.
func (p *caddyProc) stop() {
	p.stopOnce.Do(func() {
		if p.cmd == nil || p.cmd.Process == nil {
			return
		}
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			return
		case <-time.After(stopGrace):
		}
		p.dump = p.fetchGoroutines()
		p.dumped = true
		_ = p.cmd.Process.Kill()
		<-p.done
	})
}

// fetchGoroutines returns the stacks of every goroutine of the running
// Caddy, from its admin endpoint, or why they could not be read.
func (p *caddyProc) fetchGoroutines() string {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(p.adminURL("/debug/pprof/goroutine?debug=2"))
	if err != nil {
		return "(no goroutine dump: " + err.Error() + ")"
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "(goroutine dump cut short: " + err.Error() + ")\n" + string(b)
	}
	return string(b)
}

// goroutineDump returns the goroutines stop read from a Caddy that did
// not exit in time, at most 400 lines.
func (p *caddyProc) goroutineDump() string {
	lines := strings.Split(p.dump, "\n")
	if len(lines) > 400 {
		lines = lines[:400]
	}
	return strings.Join(lines, "\n")
}

func (p *caddyProc) url(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(p.httpPort) + path
}

func (p *caddyProc) adminURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(p.adminPort) + path
}

// reload POSTs a new Caddyfile (same ports, new global options and routes)
// to the admin /load endpoint and fails the test unless it is accepted.
func (p *caddyProc) reload(t *testing.T, global, routes string) {
	t.Helper()
	body := p.render(global, routes)
	req, err := http.NewRequest(http.MethodPost, p.adminURL("/load"), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/caddyfile")
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("caddy %s: POST /load: %v", p.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("caddy %s: POST /load: status %d: %s\nconfig:\n%s", p.name, resp.StatusCode, b, body)
	}
}

func (p *caddyProc) logText() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func (p *caddyProc) logTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.logText(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// storeFailedMsg is the message of the handler's (rate-limited) store error
// log line.
const storeFailedMsg = "rate limit store failed"

var suppressedRE = regexp.MustCompile(`"suppressed_since_last":\s*(\d+)`)

// storeFailures counts the store-error log lines of p and the failures they
// report as suppressed since the previous line. The handler logs at most one
// line per 5 s and reports the failures in between on the next line, so the
// suppressed failures after the last line are not counted.
func (p *caddyProc) storeFailures() (lines, suppressed int, samples []string) {
	for _, l := range strings.Split(p.logText(), "\n") {
		if !strings.Contains(l, storeFailedMsg) {
			continue
		}
		lines++
		if m := suppressedRE.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			suppressed += n
		}
		if len(samples) < 3 {
			samples = append(samples, l)
		}
	}
	return lines, suppressed, samples
}

// result is one HTTP exchange.
type result struct {
	code   int
	header http.Header
	body   string
	dur    time.Duration
	err    error
}

// decided reports whether the limiter decided the request through its store
// (or its fail-local memory): then the legacy headers are set. A request let
// through by a fail-open zone, or refused by a fail-closed one, carries none.
func (r result) decided() bool { return r.header.Get("X-Ratelimit-Limit") != "" }

func (r result) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	return fmt.Sprintf("%d limit=%q remaining=%q retry-after=%q body=%q (%v)", r.code,
		r.header.Get("X-Ratelimit-Limit"), r.header.Get("X-Ratelimit-Remaining"), r.header.Get("Retry-After"),
		r.body, r.dur.Round(time.Microsecond))
}

// newClient returns an HTTP client for loopback with up to conns idle
// connections per host.
func newClient(conns int) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConns:        conns * 4,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     30 * time.Second,
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// send sends GET url with the given headers ("Name: value"). It never
// fails the test: errors are in the result.
func send(c *http.Client, url string, headers ...string) result {
	req, err := newGet(url, headers...)
	if err != nil {
		return result{err: err}
	}
	return sendReq(c, req)
}

func newGet(url string, headers ...string) (*http.Request, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			return nil, fmt.Errorf("bad header %q", h)
		}
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	return req, nil
}

func sendReq(c *http.Client, req *http.Request) result {
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return result{err: err, dur: time.Since(t0)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	dur := time.Since(t0)
	if err != nil {
		return result{err: err, dur: dur}
	}
	return result{code: resp.StatusCode, header: resp.Header, body: string(b), dur: dur}
}

// sendAfterReload is send for the moments right after a config reload:
// Caddy's old server, shutting down, may take one new connection and close
// it without handling its request (net/http checks shuttingDown() before
// calling the handler), which the client sees as EOF or a reset. That
// request reached no handler, so it is sent again (at most twice more).
func sendAfterReload(t *testing.T, c *http.Client, url string, headers ...string) result {
	t.Helper()
	for attempt := 1; ; attempt++ {
		r := send(c, url, headers...)
		if r.err == nil || attempt == 3 || !(errors.Is(r.err, io.EOF) || errors.Is(r.err, syscall.ECONNRESET)) {
			return r
		}
		t.Logf("GET %s: %v (connection taken by the old server of a reload); sending it again", url, r.err)
	}
}

// mustGet sends GET and fails the test on a transport error.
func mustGet(t *testing.T, c *http.Client, url string, headers ...string) result {
	t.Helper()
	r := send(c, url, headers...)
	if r.err != nil {
		t.Fatalf("GET %s: %v", url, r.err)
	}
	return r
}

// expectCode checks the status.
func expectCode(t *testing.T, r result, code int, what string) bool {
	t.Helper()
	if r.err != nil {
		t.Errorf("%s: %v, want status %d", what, r.err, code)
		return false
	}
	if r.code != code {
		t.Errorf("%s: %s, want status %d", what, r, code)
		return false
	}
	return true
}

// expectRemaining checks X-RateLimit-Limit and -Remaining.
func expectRemaining(t *testing.T, r result, limit, remaining int, what string) {
	t.Helper()
	if got := r.header.Get("X-Ratelimit-Limit"); got != strconv.Itoa(limit) {
		t.Errorf("%s: X-RateLimit-Limit %q, want %d (%s)", what, got, limit, r)
	}
	if got := r.header.Get("X-Ratelimit-Remaining"); got != strconv.Itoa(remaining) {
		t.Errorf("%s: X-RateLimit-Remaining %q, want %d (%s)", what, got, remaining, r)
	}
}

// retryAfter parses Retry-After, or returns -1.
func retryAfter(r result) int {
	v := r.header.Values("Retry-After")
	if len(v) != 1 {
		return -1
	}
	n, err := strconv.Atoi(v[0])
	if err != nil {
		return -1
	}
	return n
}

// scanKeys returns the keys of s matching pattern (SCAN, bounded), but the
// store's control keys (<prefix>ctl:{sluice…}:…, which every store with a
// deny cache keeps: see redisstore's watch.go).
func scanKeys(t *testing.T, s *redistest.Server, pattern string) []string {
	t.Helper()
	var keys []string
	cursor := "0"
	for range 10000 {
		v := s.Do(t, "SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			t.Fatalf("SCAN on %s: unexpected reply %v", s.Addr, v)
		}
		cursor = fmt.Sprint(a[0])
		for _, k := range a[1].([]any) {
			if k := fmt.Sprint(k); !strings.Contains(k, "ctl:{sluice") {
				keys = append(keys, k)
			}
		}
		if cursor == "0" {
			slices.Sort(keys)
			return keys
		}
	}
	t.Fatalf("SCAN on %s: no end", s.Addr)
	return nil
}

// pttl returns PTTL of key on s.
func pttl(t *testing.T, s *redistest.Server, key string) int64 {
	t.Helper()
	v, ok := s.Do(t, "PTTL", key).(int64)
	if !ok {
		t.Fatalf("PTTL %s: unexpected reply", key)
	}
	return v
}

// waitFor polls cond every 50 ms until it returns true or timeout passes,
// and reports how long it took and whether it succeeded.
func waitFor(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	t0 := time.Now()
	for {
		if cond() {
			return time.Since(t0), true
		}
		if time.Since(t0) > timeout {
			return time.Since(t0), false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// traffic sends GET url every interval from a goroutine until stopped, and
// records every result, to watch for errors while the store changes under
// a zone.
type traffic struct {
	mu      sync.Mutex
	results []result
	cancel  context.CancelFunc
	done    chan struct{}
}

func startTraffic(c *http.Client, interval time.Duration, url string, headers func(i int) []string) *traffic {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; i < 100000; i++ {
			r := send(c, url, headers(i)...)
			tr.mu.Lock()
			tr.results = append(tr.results, r)
			tr.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return tr
}

// stop stops the traffic and returns what it recorded.
func (tr *traffic) stop() []result {
	tr.cancel()
	<-tr.done
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.results)
}

// tally counts results by status ("err" for transport errors).
func tally(rs []result) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		if r.err != nil {
			m["err"]++
			continue
		}
		k := strconv.Itoa(r.code)
		if r.code == 200 && !r.decided() {
			k = "200-undecided"
		}
		m[k]++
	}
	return m
}

// countRound counts a burst's decided answers, allowed (200) and refused (429);
// anything else, or a 200 no store decided, is an error of round.
func countRound(t *testing.T, round int, out []result) (allowed, refused int) {
	t.Helper()
	for i, res := range out {
		switch {
		case res.err != nil:
			t.Errorf("round %d: request %d: %v", round, i, res.err)
		case res.code == http.StatusOK && !res.decided():
			t.Errorf("round %d: request %d let through undecided: %s", round, i, res)
		case res.code == http.StatusOK:
			allowed++
		case res.code == http.StatusTooManyRequests:
			refused++
		default:
			t.Errorf("round %d: request %d: %s", round, i, res)
		}
	}
	return allowed, refused
}

// percentile returns the p-th percentile (0..100) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}
