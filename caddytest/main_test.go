// Package caddytest_test holds Sluice's end-to-end tests: the rate_limit
// directive inside a real Caddy, configured through the admin API with
// Caddyfiles (and a few JSON configs), exercised over loopback HTTP.
//
// One Caddy runs in this test process for the whole package (TestMain starts
// it). Every test loads its own full configuration through POST /load (via
// Caddy's caddytest package), keeping the admin endpoint on adminPort so
// caddytest never falls back to skipping. The tests therefore never run in
// parallel with each other. Zone names are global and the default memory
// store outlives reloads by design, so every test uses zone names of its own
// (zoneName adds a process-wide sequence number, which also keeps -count=N
// runs independent).
package caddytest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddytest"

	// Stock Caddy plus the plugin under test.
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	_ "github.com/sluicehq/caddy-sluice"
)

// Loopback ports of this process, chosen free by TestMain (so two test
// runs on one machine do not collide).
var (
	adminPort int
	portA     int // the main site
	portB     int // a second site, for zones shared across sites

	adminURL, siteA, siteB string
)

// pickPorts reserves three distinct free loopback ports (held open together
// so the kernel cannot hand out the same one twice, then released for Caddy).
func pickPorts() error {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 3)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	adminPort, portA, portB = ports[0], ports[1], ports[2]
	adminURL = "http://localhost:" + strconv.Itoa(adminPort)
	siteA = "http://localhost:" + strconv.Itoa(portA)
	siteB = "http://localhost:" + strconv.Itoa(portB)
	return nil
}

// storageDir is Caddy's storage for this process (a temp dir): Caddy's
// default storage path is computed at init, before TestMain could move it.
var storageDir string

// initialConfig is what TestMain loads: just the admin endpoint, as the
// Caddyfiles below render it.
func initialConfig() string {
	return fmt.Sprintf(`{"admin":{"listen":"localhost:%d","config":{"persist":false}},"storage":{"module":"file_system","root":%q}}`, adminPort, storageDir)
}

func TestMain(m *testing.M) {
	if err := pickPorts(); err != nil {
		fmt.Fprintln(os.Stderr, "caddytest: picking free loopback ports:", err)
		os.Exit(1)
	}
	// Keep Caddy's autosave and data out of the user's directories.
	tmp, err := os.MkdirTemp("", "sluice-caddytest-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "caddytest: creating a temp dir:", err)
		os.Exit(1)
	}
	os.Setenv("XDG_CONFIG_HOME", tmp)
	os.Setenv("XDG_DATA_HOME", tmp)
	storageDir = tmp

	// caddytest talks to the admin endpoint through http.DefaultTransport.
	// Every load replaces Caddy's admin server, and the old one may take
	// one new connection and close it unanswered (see doRetry); caddytest
	// would read that as "Caddy is not running" and start a second Caddy
	// with a bare config in the background. Retrying such requests keeps
	// the harness on the one Caddy started here.
	http.DefaultTransport = retryEOF{base: http.DefaultTransport}

	if err := caddy.Load([]byte(initialConfig()), true); err != nil {
		fmt.Fprintf(os.Stderr, "caddytest: starting the in-process Caddy failed: %v\n", err)
		os.RemoveAll(tmp)
		os.Exit(1)
	}
	if err := waitAdmin(10 * time.Second); err != nil {
		fmt.Fprintf(os.Stderr, "caddytest: Caddy's admin endpoint on localhost:%d does not answer: %v (every test would be skipped by caddytest; refusing to run)\n", adminPort, err)
		_ = caddy.Stop()
		os.RemoveAll(tmp)
		os.Exit(1)
	}
	code := m.Run()
	_ = caddy.Stop()
	os.RemoveAll(tmp)
	os.Exit(code)
}

// waitAdmin polls GET /config/ until it answers 200.
func waitAdmin(limit time.Duration) error {
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(limit)
	var last error
	for time.Now().Before(deadline) {
		resp, err := c.Get(adminURL + "/config/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	return last
}

// seq makes zone names unique across the tests of this process.
var seq atomic.Int64

// zoneName returns a zone name of its own for base.
func zoneName(base string) string {
	return fmt.Sprintf("%s_%d", base, seq.Add(1))
}

// nonce distinguishes the keys of this process from any earlier run's.
var nonce = strconv.FormatInt(time.Now().UnixNano(), 36)

// globalBlock is the global options block every config starts with.
const globalBlock = `{
	admin localhost:@ADMIN@
	persist_config off
	auto_https off
	http_port @A@
	default_bind 127.0.0.1
	storage file_system @STORAGE@
@GLOBAL@
}
`

var unreplaced = regexp.MustCompile(`@[A-Z0-9_]+@`)

// config renders a Caddyfile: the global block (with extra global options)
// and the sites. In both, @A@ and @B@ are the site ports, @ADMIN@ the admin
// port, and every further pair of vars replaces @NAME@ with a value.
func config(global, sites string, vars ...string) string {
	pairs := []string{"@STORAGE@", storageDir, "@ADMIN@", strconv.Itoa(adminPort), "@A@", strconv.Itoa(portA), "@B@", strconv.Itoa(portB), "@GLOBAL@", global}
	for i := 0; i+1 < len(vars); i += 2 {
		pairs = append(pairs, "@"+vars[i]+"@", vars[i+1])
	}
	r := strings.NewReplacer(pairs...)
	out := r.Replace(r.Replace(globalBlock) + sites)
	if v := unreplaced.FindString(out); v != "" {
		// A forgotten variable would silently change the test; fail loudly.
		panic("config: unreplaced variable " + v + " in:\n" + out)
	}
	return out
}

// newTester returns a caddytest Tester bound to this package's admin port.
// It fails the test if caddytest ever decided the admin endpoint was down
// and started its own Caddy (it rewrites os.Args to do so), since that Caddy
// loads a bare config behind the test's back.
func newTester(t *testing.T) *caddytest.Tester {
	t.Helper()
	if testing.Short() {
		// caddytest skips every test in -short mode; a silent skip would
		// read as a pass.
		t.Fatal("the end-to-end tests do not run in -short mode (caddytest would skip them silently); run without -short")
	}
	args := slices.Clone(os.Args)
	t.Cleanup(func() {
		if !slices.Equal(args, os.Args) {
			t.Errorf("caddytest found the admin endpoint unreachable and started its own Caddy (os.Args now %q); the tests' configs are no longer trustworthy", os.Args)
		}
	})
	return caddytest.NewTester(t).WithDefaultOverrides(caddytest.Config{AdminPort: adminPort})
}

// load loads a Caddyfile through POST /load and fails the test at once if
// it is not running afterwards. Idle connections to the old servers are
// dropped (the tester's and every loopbackClient's) so the next request
// reaches the new configuration; a test with other clients of its own
// closes theirs after a load.
func load(t *testing.T, tc *caddytest.Tester, caddyfile string) {
	t.Helper()
	failed := t.Failed()
	tc.InitServer(caddyfile, "caddyfile")
	if t.Failed() && !failed {
		t.Fatalf("loading the config failed; config:\n%s", caddyfile)
	}
	// A load returns once the old servers' shutdowns have been scheduled,
	// not run (caddyhttp's App.Stop): until they close their listeners an
	// old server may still accept a connection and answer with the old
	// configuration. Give them a moment.
	time.Sleep(oldServersStop)
	if tr, ok := tc.Client.Transport.(*http.Transport); ok {
		tr.CloseIdleConnections()
	}
	loopbackTransports.Range(func(tr, _ any) bool {
		tr.(*http.Transport).CloseIdleConnections()
		return true
	})
}

// oldServersStop is how long load waits for the old servers to stop
// accepting.
const oldServersStop = 25 * time.Millisecond

// postLoad POSTs a config to /load itself (for configs that must be
// refused) and returns the status and the body.
func postLoad(t *testing.T, body, contentType string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, adminURL+"/load", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST /load: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST /load: reading the answer: %v", err)
	}
	return resp.StatusCode, string(b)
}

// expectLoadRefused POSTs a config that must be refused and checks that the
// error names every one of wants.
func expectLoadRefused(t *testing.T, body, contentType string, wants ...string) {
	t.Helper()
	code, msg := postLoad(t, body, contentType)
	t.Logf("POST /load: %d %s", code, strings.TrimSpace(msg))
	if code == http.StatusOK {
		t.Fatalf("POST /load accepted a config that must be refused:\n%s", body)
	}
	if code != http.StatusBadRequest {
		t.Errorf("POST /load: status %d, want 400 (message %q)", code, msg)
	}
	for _, w := range wants {
		if !strings.Contains(msg, w) {
			t.Errorf("POST /load error %q does not mention %q", msg, w)
		}
	}
}

// result is one HTTP exchange.
type result struct {
	code   int
	header http.Header
	body   string
}

// get sends GET url with the given headers ("Name: value") through c.
func get(t *testing.T, c *http.Client, url string, headers ...string) result {
	t.Helper()
	return do(t, c, http.MethodGet, url, headers...)
}

func do(t *testing.T, c *http.Client, method, url string, headers ...string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			t.Fatalf("bad header %q", h)
		}
		req.Header.Set(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	resp, err := doRetry(t, c, req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return result{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

// doRetry sends a body-less request, sending it again when the connection
// is closed before any answer (io.EOF, or a reset when the server closed it
// with the request unread).
//
// Right after a reload, Caddy's old server may still be blocked in Accept on
// the listener it shares with the new server and take one new connection;
// being shut down, Go's http.Server reads the request and closes the
// connection without handling it (net/http's conn.serve checks
// shuttingDown() before calling the handler). That request never reached
// any handler, so sending it again cannot double-count; the new server never
// closes a connection without an answer.
func doRetry(t *testing.T, c *http.Client, req *http.Request) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		resp, err := c.Do(req)
		if err == nil || attempt == 3 || req.Body != nil || !isUnanswered(err) {
			return resp, err
		}
		t.Logf("%s %s: %v (connection taken by the old server of a reload); sending it again", req.Method, req.URL, err)
	}
}

// retryEOF is a RoundTripper that sends a request again when its
// connection was closed before any answer, for the reason doRetry explains;
// it holds for Caddy's admin endpoint too, where a shutting-down admin
// server closes a taken connection without handling its request.
type retryEOF struct{ base http.RoundTripper }

func (r retryEOF) RoundTrip(req *http.Request) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		resp, err := r.base.RoundTrip(req)
		if err == nil || attempt == 3 || !isUnanswered(err) {
			return resp, err
		}
		if req.Body != nil {
			if req.GetBody == nil {
				return resp, err
			}
			body, gerr := req.GetBody()
			if gerr != nil {
				return resp, err
			}
			req = req.Clone(req.Context())
			req.Body = body
		}
	}
}

// isUnanswered reports a connection closed before any response.
func isUnanswered(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// expect checks the status and returns the result for more checks.
func expect(t *testing.T, r result, code int, what string) result {
	t.Helper()
	if r.code != code {
		t.Errorf("%s: status %d, want %d (body %q, headers %v)", what, r.code, code, r.body, r.header)
	}
	return r
}

// intHeader parses an integer header, failing the test if it is missing or
// malformed.
func intHeader(t *testing.T, r result, name string) int64 {
	t.Helper()
	vals := r.header.Values(name)
	if len(vals) != 1 {
		t.Errorf("header %s: got %q, want exactly one value", name, vals)
		return -1
	}
	n, err := strconv.ParseInt(vals[0], 10, 64)
	if err != nil {
		t.Errorf("header %s: %q is not an integer", name, vals[0])
		return -1
	}
	return n
}

// expectLimitHeaders checks X-RateLimit-Limit and -Remaining exactly.
func expectLimitHeaders(t *testing.T, r result, limit, remaining int64, what string) {
	t.Helper()
	if got := intHeader(t, r, "X-Ratelimit-Limit"); got != limit {
		t.Errorf("%s: X-RateLimit-Limit %d, want %d", what, got, limit)
	}
	if got := intHeader(t, r, "X-Ratelimit-Remaining"); got != remaining {
		t.Errorf("%s: X-RateLimit-Remaining %d, want %d", what, got, remaining)
	}
}

// expectNoLimitHeaders checks that no rate limit header of any flavour is
// present.
func expectNoLimitHeaders(t *testing.T, r result, what string) {
	t.Helper()
	for name := range r.header {
		l := strings.ToLower(name)
		if strings.HasPrefix(l, "x-ratelimit") || strings.HasPrefix(l, "ratelimit") {
			t.Errorf("%s: unexpected header %s: %q", what, name, r.header.Values(name))
		}
	}
}

// expectRetryAfter checks Retry-After is an integer in [lo, hi] and returns it.
func expectRetryAfter(t *testing.T, r result, lo, hi int64, what string) int64 {
	t.Helper()
	ra := intHeader(t, r, "Retry-After")
	if ra < lo || ra > hi {
		t.Errorf("%s: Retry-After %d, want between %d and %d", what, ra, lo, hi)
	}
	return ra
}

// loopbackTransports are the transports of every loopbackClient, whose
// idle connections load drops.
var loopbackTransports sync.Map

// loopbackClient returns a client for many concurrent connections to the
// loopback sites.
func loopbackClient(conns int) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 5 * time.Second}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
		},
		MaxIdleConns:        conns * 2,
		MaxIdleConnsPerHost: conns * 2,
		MaxConnsPerHost:     0,
		IdleConnTimeout:     30 * time.Second,
	}
	loopbackTransports.Store(tr, struct{}{})
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// adminConfig returns the running config, decoded.
func adminConfig(t *testing.T) any {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(adminURL + "/config/")
	if err != nil {
		t.Fatalf("GET /config/: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&v); err != nil {
		t.Fatalf("GET /config/: %v in %s", err, b)
	}
	return v
}

// findHandlers returns every JSON object of the config whose "handler" is name.
func findHandlers(v any, name string) []map[string]any {
	var out []map[string]any
	switch v := v.(type) {
	case map[string]any:
		if v["handler"] == name {
			out = append(out, v)
		}
		for _, c := range v {
			out = append(out, findHandlers(c, name)...)
		}
	case []any:
		for _, c := range v {
			out = append(out, findHandlers(c, name)...)
		}
	}
	return out
}
