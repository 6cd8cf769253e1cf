package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// startTimeout bounds one start of one process, from exec to PONG.
	startTimeout = 10 * time.Second
	// stopGrace is how long a process has to exit after SIGTERM before SIGKILL.
	stopGrace = 3 * time.Second
	// cmdTimeout bounds one helper command (Do, Info, ...).
	cmdTimeout = 5 * time.Second
	// startAttempts is how many ports a start tries when the one it picked
	// was taken by someone else between FreePort and the server's bind.
	startAttempts = 3
	// logTailLines is how much of a process's log a failure shows.
	logTailLines = 40
)

// Server is one real redis-server (or redis-sentinel) process on 127.0.0.1.
type Server struct {
	Addr string // "127.0.0.1:<Port>"
	Port int
	Dir  string // the process's own directory: config file, log, nodes.conf
	// BusPort is the cluster bus port of a cluster node, 0 otherwise.
	BusPort int
	// TLSAddr and TLSPort: the TLS listener of a StartTLS server.
	TLSAddr string
	TLSPort int

	kind    string   // "redis-server" or "redis-sentinel", for messages
	argv    []string // command without the config file
	conf    string   // path of the config file
	logPath string   // stdout+stderr of every run, appended

	mu      sync.Mutex
	proc    *process
	closers closerSet
}

type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // cmd.Wait's result, valid after done
}

// closerSet closes clients handed out to tests, at cleanup.
type closerSet struct {
	mu sync.Mutex
	cs []io.Closer
}

func (c *closerSet) add(x io.Closer) {
	c.mu.Lock()
	c.cs = append(c.cs, x)
	c.mu.Unlock()
}

func (c *closerSet) closeAll() {
	c.mu.Lock()
	cs := c.cs
	c.cs = nil
	c.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		_ = cs[i].Close()
	}
}

// Start starts a standalone redis-server on a free loopback port and stops it
// at t's cleanup. extraConfig entries are redis.conf lines appended to the
// defaults (they win over them), e.g. "maxmemory 10mb".
func Start(t testing.TB, extraConfig ...string) *Server {
	t.Helper()
	return startNode(t, "redis-server", func(*Server) []string { return extraConfig })
}

// startNode starts one process of the given kind. lines returns the config
// lines that follow the defaults; it is called once per attempt, after the
// port is picked, and may pick more ports (the cluster bus port).
func startNode(t testing.TB, kind string, lines func(s *Server) []string) *Server {
	t.Helper()
	argv := findBinary(t, kind)
	var lastErr error
	var last *Server
	for attempt := 1; attempt <= startAttempts; attempt++ {
		s := &Server{kind: kind, argv: argv, Dir: t.TempDir()}
		s.Port = FreePort(t)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		s.conf = filepath.Join(s.Dir, kind+".conf")
		s.logPath = filepath.Join(s.Dir, kind+".log")
		cfg := s.defaultConfig()
		cfg = append(cfg, lines(s)...)
		if err := os.WriteFile(s.conf, []byte(strings.Join(cfg, "\n")+"\n"), 0o644); err != nil {
			t.Fatalf("redistest: write %s: %v", s.conf, err)
		}
		err := s.launch()
		if err == nil {
			t.Cleanup(func() {
				s.closers.closeAll()
				s.Stop()
			})
			return s
		}
		lastErr, last = err, s
		if !strings.Contains(s.LogTail(), "Address already in use") {
			break
		}
	}
	t.Fatalf("redistest: start %s on %s: %v\n%s", kind, last.Addr, lastErr, last.logTailBlock())
	return nil
}

func (s *Server) defaultConfig() []string {
	cfg := []string{
		fmt.Sprintf("port %d", s.Port),
		"bind 127.0.0.1",
		"protected-mode yes",
		"daemonize no",
		"dir " + quoteConf(s.Dir),
		`logfile ""`,
		"loglevel notice",
	}
	if s.kind == "redis-server" {
		cfg = append(cfg,
			`save ""`,
			"appendonly no",
			// A replica's first full sync starts at once, not after the
			// default 5 s wait for more replicas.
			"repl-diskless-sync-delay 0",
			// DEBUG SLEEP and friends, from loopback only, for slow-server tests.
			"enable-debug-command local",
		)
	}
	return cfg
}

// findBinary returns the command that runs a process of the given kind, or
// fails the test with the message that tells what to do.
func findBinary(t testing.TB, kind string) []string {
	t.Helper()
	if p, err := exec.LookPath(kind); err == nil {
		return []string{p}
	}
	if kind == "redis-sentinel" {
		// redis-sentinel is redis-server under another name; the flag works
		// when only the server is installed.
		if p, err := exec.LookPath("redis-server"); err == nil {
			return []string{p, "--sentinel"}
		}
		kind = "redis-server"
	}
	t.Fatalf("%s not found: run scripts/ensure-redis.sh (make test does)", kind)
	return nil
}

// launch execs the process with the config file and waits until it answers
// PING, at most startTimeout. On failure the process is stopped.
func (s *Server) launch() error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// The config file comes first: redis-server <conf> [--sentinel].
	args := append([]string{s.conf}, s.argv[1:]...)
	cmd := exec.Command(s.argv[0], args...)
	cmd.Dir = s.Dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = logf.Close()
		close(p.done)
	}()
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	if err := waitPing(s.Addr, p, startTimeout); err != nil {
		s.Stop()
		return err
	}
	return nil
}

// waitPing polls addr with a raw RESP PING until it answers +PONG, the
// process exits, or timeout passes.
func waitPing(addr string, p *process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		select {
		case <-p.done:
			return fmt.Errorf("process exited during start-up (%v)", p.err)
		default:
		}
		if last = rawPing(addr); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no PONG within %v: %v", timeout, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func rawPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 250*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := io.WriteString(c, "*1\r\n$4\r\nPING\r\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Stop stops the process (SIGTERM, then SIGKILL after a short grace) and
// waits for it to exit. The port and the directory are kept for Restart.
// Stopping a stopped server does nothing.
func (s *Server) Stop() { s.halt(false) }

// Kill kills the process with SIGKILL at once, like a crash, and waits for
// it to exit. The port and the directory are kept for Restart.
func (s *Server) Kill() { s.halt(true) }

func (s *Server) halt(kill bool) {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	if !kill {
		_ = signalTerm(p.cmd.Process)
		_ = signalCont(p.cmd.Process) // a frozen process must run to handle SIGTERM
		select {
		case <-p.done:
			return
		case <-time.After(stopGrace):
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Running reports whether the process is running (it may be frozen).
func (s *Server) Running() bool {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Restart starts the server again on the same port, with the same directory
// and config file (stopping it first if it runs). Nothing is persisted, so a
// standalone server comes back empty (no keys, no scripts); a cluster node
// comes back with its nodes.conf, and a sentinel with its rewritten config.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	if err := s.launch(); err != nil {
		t.Fatalf("redistest: restart %s on %s: %v\n%s", s.kind, s.Addr, err, s.logTailBlock())
	}
}

// Freeze sends SIGSTOP: the kernel still accepts connections on the port but
// nothing is ever answered, which is what a hung or overloaded Redis looks
// like to a client. Stop and cleanup work on a frozen server.
func (s *Server) Freeze(t testing.TB) {
	t.Helper()
	s.signal(t, "SIGSTOP", signalStop)
}

// Thaw sends SIGCONT to a frozen server.
func (s *Server) Thaw(t testing.TB) {
	t.Helper()
	s.signal(t, "SIGCONT", signalCont)
}

func (s *Server) signal(t testing.TB, name string, send func(*os.Process) error) {
	t.Helper()
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p == nil {
		t.Fatalf("redistest: %s %s: not running", name, s.Addr)
		return
	}
	if err := send(p.cmd.Process); err != nil {
		t.Fatalf("redistest: %s %s: %v", name, s.Addr, err)
	}
}

// URL returns redis://127.0.0.1:<port>.
func (s *Server) URL() string { return "redis://" + s.Addr }

// Client returns a new go-redis client for the server with default options,
// closed at the cleanup of the test that started the server.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	s.closers.add(c)
	return c
}

// helperClient is the short-lived connection of Do and friends: RESP2 (plain
// arrays, predictable shapes), no CLIENT SETINFO, no retries, no pool.
func helperClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:             addr,
		Protocol:         2,
		DisableIdentity:  true,
		MaxRetries:       -1,
		DialerRetries:    1,
		PoolSize:         1,
		PipelinePoolSize: -1,
		DialTimeout:      2 * time.Second,
		ReadTimeout:      cmdTimeout,
		WriteTimeout:     cmdTimeout,
	})
}

// DoErr runs one command on a fresh short-lived connection and returns the
// reply and the error as go-redis gives them (redis.Nil for a nil reply).
func (s *Server) DoErr(args ...any) (any, error) {
	return doAt(s.Addr, args...)
}

func doAt(addr string, args ...any) (any, error) {
	c := helperClient(addr)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	return c.Do(ctx, args...).Result()
}

// Do runs one command on a fresh short-lived connection and returns its
// reply (RESP2 shapes: string, int64, []any; nil for a nil reply). Any error
// fails the test.
func (s *Server) Do(t testing.TB, args ...any) any {
	t.Helper()
	v, err := s.DoErr(args...)
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		t.Fatalf("redistest: %s %v: %v\n%s", s.Addr, args, err, s.logTailBlock())
	}
	return v
}

// Info returns the fields of INFO <section> (all sections when empty).
func (s *Server) Info(t testing.TB, section string) map[string]string {
	t.Helper()
	args := []any{"INFO"}
	if section != "" {
		args = append(args, section)
	}
	v := s.Do(t, args...)
	str, ok := v.(string)
	if !ok {
		t.Fatalf("redistest: %s INFO %s: unexpected reply %T", s.Addr, section, v)
	}
	return parseInfo(str)
}

func parseInfo(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// LogTail returns the last lines of the process's log (all runs).
func (s *Server) LogTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return strings.Join(lines, "\n")
}

func (s *Server) logTailBlock() string {
	return fmt.Sprintf("--- %s %s log (%s) ---\n%s\n--- end of log ---", s.kind, s.Addr, s.logPath, s.LogTail())
}

// quoteConf quotes a value for redis.conf (sdssplitargs syntax).
func quoteConf(v string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c >= 0x7f:
			fmt.Fprintf(&b, `\x%02x`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

var (
	portsMu   sync.Mutex
	portsUsed = map[int]bool{}
)

// FreePort returns a port of 127.0.0.1 that was free a moment ago (listen on
// port 0, close). It never returns the same port twice in one test binary.
// Another process may still take it before the caller binds it; the starts
// of this package retry on "Address already in use".
func FreePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("redistest: free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !portsUsed[port] {
			portsUsed[port] = true
			return port
		}
	}
	t.Fatalf("redistest: free port: no new port in 100 tries")
	return 0
}

// waitUntil polls cond every 50 ms until it reports done or timeout passes;
// then it fails the test with what, the last state cond described and the
// log tails of the servers given.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() (bool, string), servers ...*Server) {
	t.Helper()
	waitEvery(t, timeout, 50*time.Millisecond, what, cond, servers...)
}

// waitEvery is waitUntil polling every period.
func waitEvery(t testing.TB, timeout, period time.Duration, what string, cond func() (bool, string), servers ...*Server) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, state := cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			var logs []string
			for _, s := range servers {
				logs = append(logs, s.logTailBlock())
			}
			t.Fatalf("redistest: %s: not within %v; last state: %s\n%s", what, timeout, state, strings.Join(logs, "\n"))
			return
		}
		time.Sleep(period)
	}
}
