package main

// These tests build this command (stock Caddy plus Sluice), run the README's
// demo (../../Caddyfile.example) on free loopback ports, and check what the
// README promises: the rate limit headers on a 200, and a 429 with
// Retry-After, Cache-Control: no-store, a JSON body and the CORS header on
// the sixth login attempt.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	buildTimeout = 10 * time.Minute // a cold build of Caddy on a busy machine
	startTimeout = 60 * time.Second // from exec to the first answer
	stopTimeout  = 15 * time.Second // from SIGINT to SIGKILL
)

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// caddyBinary builds this package once per test binary and returns the
// executable's path. A failed build fails the test: it is never skipped.
func caddyBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "sluice-cmd-caddy-")
		if buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "caddy")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		args := []string{"build", "-o", buildBin}
		if raceEnabled() {
			// Reuse the race-instrumented packages this test binary was
			// built from (no second compile of Caddy), and run the demo
			// under the race detector too.
			args = append(args, "-race")
		}
		cmd := exec.CommandContext(ctx, "go", append(args, ".")...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go %s .: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("building the caddy command: %v", buildErr)
	}
	return buildBin
}

// raceEnabled reports whether this test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

func TestListModules(t *testing.T) {
	bin := caddyBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("caddy list-modules: %v\n%s", err, out)
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		listed[strings.TrimSpace(line)] = true
	}
	for _, id := range []string{
		"http.handlers.rate_limit",
		"http.handlers.rate_limit.stores.memory",
		"http.handlers.rate_limit.stores.redis",
		"admin.api.rate_limit",
	} {
		if !listed[id] {
			t.Errorf("caddy list-modules does not list %s:\n%s", id, out)
		}
	}
}

// demo is a running Caddy serving Caddyfile.example.
type demo struct {
	base string // http://127.0.0.1:<port>
	log  string // path of the process's combined output
}

// freePorts returns n distinct loopback ports that were free a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("picking a free port: %v", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// startDemo runs `caddy run --config ../../Caddyfile.example` on free ports
// and waits until it answers. The process is stopped by t.Cleanup.
func startDemo(t *testing.T, bin string) *demo {
	t.Helper()
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		d, err := tryStartDemo(t, bin)
		if err == nil {
			return d
		}
		lastErr = err
		// A port picked as free may have been taken in the meantime: retry
		// with new ports, but only for that.
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
		t.Logf("attempt %d: %v; retrying on other ports", attempt, err)
	}
	t.Fatalf("starting the demo: %v", lastErr)
	return nil
}

func tryStartDemo(t *testing.T, bin string) (*demo, error) {
	ports := freePorts(t, 2)
	httpPort, adminPort := ports[0], ports[1]

	home := t.TempDir()
	logPath := filepath.Join(home, "caddy.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "run", "--config", "../../Caddyfile.example")
	cmd.Env = append(os.Environ(),
		"SLUICE_PORT="+strconv.Itoa(httpPort),
		"SLUICE_ADMIN_PORT="+strconv.Itoa(adminPort),
		// Keep Caddy's autosave and data out of the real home directory.
		"HOME="+home,
		"XDG_CONFIG_HOME="+filepath.Join(home, "config"),
		"XDG_DATA_HOME="+filepath.Join(home, "data"),
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Stop gracefully on cancel; kill if it takes longer than stopTimeout.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = stopTimeout
	if err := cmd.Start(); err != nil {
		cancel()
		logFile.Close()
		return nil, err
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	stop := func() {
		cancel()
		select {
		case <-exited:
		case <-time.After(stopTimeout + 5*time.Second):
			t.Errorf("caddy (pid %d) did not stop", cmd.Process.Pid)
		}
		logFile.Close()
	}
	started := false // a failed start reports the output in its error
	t.Cleanup(func() {
		stop()
		if started && t.Failed() {
			dumpLog(t, logPath)
		}
	})

	d := &demo{base: "http://127.0.0.1:" + strconv.Itoa(httpPort), log: logPath}
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			logText, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("caddy exited before answering (%v):\n%s", waitErr, logText)
		default:
		}
		// "/" matches no zone, so waiting spends nothing.
		resp, err := client.Get(d.base + "/")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				started = true
				return d, nil
			}
		}
		if time.Now().After(deadline) {
			stop()
			logText, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("caddy did not answer on %s within %s (last: %v):\n%s", d.base, startTimeout, err, logText)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func dumpLog(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	const maxLog = 16 << 10
	if len(b) > maxLog {
		b = b[len(b)-maxLog:]
	}
	t.Logf("caddy output (%s):\n%s", path, b)
}

func (d *demo) do(t *testing.T, method, path string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, d.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp, body
}

func intHeader(t *testing.T, resp *http.Response, name string) int64 {
	t.Helper()
	v := resp.Header.Get(name)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: want an integer, got %q (headers: %v)", name, v, resp.Header)
	}
	return n
}

func TestDemo(t *testing.T) {
	bin := caddyBinary(t)
	d := startDemo(t, bin)

	t.Run("api 200 with headers", func(t *testing.T) {
		before := time.Now().Unix()
		resp, body := d.do(t, http.MethodGet, "/api/items")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /api/items: status %d, body %s", resp.StatusCode, body)
		}
		if got := resp.Header.Get("X-Ratelimit-Limit"); got != "20" {
			t.Errorf("X-RateLimit-Limit = %q, want 20 (the api zone's burst)", got)
		}
		if got := resp.Header.Get("X-Ratelimit-Remaining"); got != "19" {
			t.Errorf("X-RateLimit-Remaining = %q, want 19", got)
		}
		reset := intHeader(t, resp, "X-Ratelimit-Reset")
		if reset <= before || reset > time.Now().Unix()+61 {
			t.Errorf("X-RateLimit-Reset = %d, want Unix seconds in the next minute (sent at %d)", reset, before)
		}
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "*" {
			t.Errorf("Access-Control-Allow-Origin = %q, want *", got)
		}
		if resp.Header.Get("Retry-After") != "" {
			t.Errorf("Retry-After on a 200: %q", resp.Header.Get("Retry-After"))
		}
	})

	t.Run("login 429 on the sixth attempt", func(t *testing.T) {
		for i := 1; i <= 5; i++ {
			resp, body := d.do(t, http.MethodPost, "/login")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("POST /login #%d: status %d, want 200; body %s", i, resp.StatusCode, body)
			}
			if got, want := resp.Header.Get("X-Ratelimit-Remaining"), strconv.Itoa(5-i); got != want {
				t.Errorf("POST /login #%d: X-RateLimit-Remaining = %q, want %s", i, got, want)
			}
		}
		resp, body := d.do(t, http.MethodPost, "/login")
		if resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("POST /login #6: status %d, want 429; body %s", resp.StatusCode, body)
		}
		retry := intHeader(t, resp, "Retry-After")
		if retry < 1 || retry > 60 {
			t.Errorf("Retry-After = %d, want 1..60 seconds", retry)
		}
		if got := resp.Header.Get("Cache-Control"); got != "no-store" {
			t.Errorf("Cache-Control = %q, want no-store", got)
		}
		if got := resp.Header.Get("Content-Type"); !strings.HasPrefix(got, "application/json") {
			t.Errorf("Content-Type = %q, want application/json", got)
		}
		if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "*" {
			t.Errorf("Access-Control-Allow-Origin = %q on the 429, want * (set by header before rate_limit)", got)
		}
		if got := resp.Header.Get("X-Ratelimit-Limit"); got != "5" {
			t.Errorf("X-RateLimit-Limit = %q on the 429, want 5", got)
		}
		if got := resp.Header.Get("X-Ratelimit-Remaining"); got != "0" {
			t.Errorf("X-RateLimit-Remaining = %q on the 429, want 0", got)
		}
		var doc struct {
			Zone       string `json:"zone"`
			RetryAfter *int64 `json:"retry_after"`
		}
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Fatalf("429 body is not JSON: %v\n%s", err, body)
		}
		if doc.Zone != "login" {
			t.Errorf(`429 body "zone" = %q, want "login"; body %s`, doc.Zone, body)
		}
		if doc.RetryAfter == nil || *doc.RetryAfter != retry {
			t.Errorf(`429 body "retry_after" = %v, want %d (Retry-After); body %s`, doc.RetryAfter, retry, body)
		}
	})

	t.Run("zones are separate", func(t *testing.T) {
		// The login zone is exhausted; the api zone still has room.
		resp, body := d.do(t, http.MethodGet, "/api/items")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /api/items after the login 429: status %d, body %s", resp.StatusCode, body)
		}
	})

	t.Run("no errors logged", func(t *testing.T) {
		f, err := os.Open(d.log)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if bytes.Contains(line, []byte(`"level":"error"`)) || bytes.Contains(line, []byte(`"level":"fatal"`)) {
				t.Errorf("caddy logged an error: %s", line)
			}
		}
		if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	})
}

// TestSimulateCommand: the build has `caddy rate-limit simulate` (registered
// by the plugin's simulate package), and it shows a fixed window admitting
// twice its limit across a window boundary.
func TestSimulateCommand(t *testing.T) {
	bin := caddyBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "rate-limit", "simulate", "--config", "../../Caddyfile.example",
		"--traffic", "window-edge:path=/login,method=POST", "--zone", "login", "--compare", "--format", "json")
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("caddy rate-limit simulate: %v\n%s", err, out)
	}
	var rep struct {
		Compare struct {
			Algorithms []struct {
				Algorithm string `json:"algorithm"`
				Allowed   int64  `json:"allowed"`
			} `json:"algorithms"`
		} `json:"compare"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	got := map[string]int64{}
	for _, a := range rep.Compare.Algorithms {
		got[a.Algorithm] = a.Allowed
	}
	want := map[string]int64{"token_bucket": 5, "gcra": 5, "sliding_window": 5, "fixed_window": 10, "sliding_log": 5}
	for alg, n := range want {
		if got[alg] != n {
			t.Errorf("%s admitted %d of the boundary burst, want %d (all: %v)", alg, got[alg], n, got)
		}
	}
}
