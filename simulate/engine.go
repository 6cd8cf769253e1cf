package simulate

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/memstore"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// Request is one request of the traffic: what the production path needs to
// decide it again.
type Request struct {
	// Time is when the request arrived, in Unix milliseconds.
	Time   int64
	Method string
	// Host is the Host header (with a port when the client sent one).
	Host string
	// URI is the request target as sent: path and query.
	URI string
	// Proto is "HTTP/1.1" (the default), "HTTP/2.0" or "HTTP/3.0".
	Proto  string
	Header http.Header
	// RemoteAddr is the TCP peer, ip:port ({remote_host}; {client_ip}
	// unless a trusted proxy's header says otherwise).
	RemoteAddr string
	// TLS: the request came over TLS, for ServerName.
	TLS        bool
	ServerName string
	// UserID is the authenticated user ({http.auth.user.id}), for a
	// configuration whose authentication handler the simulator replaces.
	UserID string
	// Status is the response status the upstream gave (an access log's
	// status), which the replaced upstream answers with, so that `count`
	// zones give back what production gave back; 0 is 200.
	Status int
	// Settled is the amount the response reported (a CSV's settled
	// column), when HasSettled: the replaced upstream reports it in every
	// settle zone's source, so that settle zones charge what production
	// charged. RespHeader holds the response headers an access log
	// recorded (resp_headers), which the replaced upstream sends again
	// (a settle header zone reads its amount there).
	Settled    int64
	HasSettled bool
	RespHeader http.Header

	seq int64 // the line number, to keep the order of equal start times
}

// run is the state of one simulation that its modules reach by id.
type run struct {
	id  string
	now int64 // the virtual clock, Unix ms (read and written by the one goroutine that serves)
	mem *memstore.Store
	rec *recorder
}

// Engine is a configuration loaded for simulation: its http app
// provisioned in this process (nothing listens), with the simulator's
// store on a virtual clock.
type Engine struct {
	// sources are the zones' settle sources (settleSources).
	sources []*zonemodel.Settle
	run     *run
	cfg     *caddy.Config
	rw      *rewritten
	servers []*simServer
	fixed   *simServer // --server
	w       discardWriter
	served  int64
	bad     int64
	sweepAt int64
	// late counts requests earlier than the virtual clock (replayed at
	// its instant); undecided counts requests no zone decided, with a few
	// of their hosts and paths.
	late, undecided int64
	triedHosts      []string
	triedPaths      []string
}

// maxTried bounds the hosts and paths of undecided requests kept for the
// report.
const maxTried = 5

type simServer struct {
	name  string
	srv   *caddyhttp.Server
	ports []caddy.NetworkAddress
	host  string // the first host a top-level route matches, for sources without one
}

// EngineOptions configure an Engine.
type EngineOptions struct {
	// Server names the http server (apps.http.servers key) that serves
	// every request; empty chooses by the request's port.
	Server string
	// Overrides change a zone before loading (--compare).
	Overrides Overrides
	// KeyOverrides are keys' overrides in force during the replay
	// (--overrides: overrides.go).
	KeyOverrides []KeyOverride
	// Recorder options.
	rec recorderOptions
}

// NewEngine loads a Caddy JSON configuration for simulation. Close it.
func NewEngine(cfgJSON []byte, opts EngineOptions) (*Engine, error) {
	var idb [12]byte
	_, _ = rand.Read(idb[:])
	id := hex.EncodeToString(idb[:])
	rw, err := rewrite(cfgJSON, id, opts.Overrides)
	if err != nil {
		return nil, err
	}
	r := &run{id: id}
	r.mem = memstore.New(memstore.Config{
		MaxKeys:       1 << 40, // never displace a key: memory is bounded by the traffic's keys
		SweepInterval: -1,      // swept by the engine, on the virtual clock
		Now:           func() int64 { return r.now },
	})
	r.rec = newRecorder(rw.zones, opts.rec)
	runs.Store(id, r)
	e := &Engine{run: r, rw: rw}
	cfg := new(caddy.Config)
	if err := json.Unmarshal(rw.json, cfg); err != nil {
		e.Close()
		return nil, err
	}
	e.cfg = cfg
	ctx, err := caddy.ProvisionContext(cfg)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("loading the config: %w", err)
	}
	if rw.invalid != nil {
		// The handler refuses the zone's config at load: not reached unless
		// the zone is somewhere Caddy does not provision.
		e.Close()
		return nil, fmt.Errorf("loading the config: %w", rw.invalid)
	}
	appMod, err := ctx.App("http")
	if err != nil {
		e.Close()
		return nil, err
	}
	app := appMod.(*caddyhttp.App)
	names := make([]string, 0, len(app.Servers))
	for n := range app.Servers {
		if _, ok := rw.hosts[n]; ok {
			// A server of the config, not one that automatic HTTPS adds
			// to redirect to HTTPS (it would only redirect).
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		s := &simServer{name: n, srv: app.Servers[n]}
		for _, l := range s.srv.Listen {
			if a, err := caddy.ParseNetworkAddress(l); err == nil {
				s.ports = append(s.ports, a)
			}
		}
		// The first site's host, else (no site names one) localhost, with
		// the first listener's port.
		s.host = "localhost"
		if hs := rw.hosts[n]; len(hs) > 0 {
			s.host = hs[0]
		}
		if len(s.ports) > 0 && s.ports[0].StartPort != 80 && s.ports[0].StartPort != 443 && s.ports[0].StartPort != 0 {
			s.host = net.JoinHostPort(s.host, strconv.FormatUint(uint64(s.ports[0].StartPort), 10))
		}
		e.servers = append(e.servers, s)
		if n == opts.Server {
			e.fixed = s
		}
	}
	if opts.Server != "" && e.fixed == nil {
		e.Close()
		return nil, fmt.Errorf("--server %q: no such server (servers: %v)", opts.Server, names)
	}
	if len(e.servers) == 1 {
		e.fixed = e.servers[0]
	}
	if err := e.applyOverrides(opts.KeyOverrides); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Sites returns the hosts the servers' sites match (of --server's server
// when one is chosen), in order.
func (e *Engine) Sites() []string {
	var out []string
	for _, s := range e.servers {
		if e.fixed != nil && s != e.fixed {
			continue
		}
		for _, h := range e.rw.hosts[s.name] {
			if !slices.Contains(out, h) {
				out = append(out, h)
			}
		}
	}
	return out
}

// Zones returns the configuration's zones.
func (e *Engine) Zones() []*ZoneConfig { return e.rw.zones }

// DefaultHost is the Host for traffic that carries none (CSV, patterns):
// the first host a route of the server matches, if any.
func (e *Engine) DefaultHost() string {
	if e.fixed != nil {
		return e.fixed.host
	}
	if len(e.servers) > 0 {
		return e.servers[0].host
	}
	return ""
}

// Close unloads the configuration (every module's Cleanup runs) and
// forgets the simulation.
func (e *Engine) Close() {
	if e.cfg != nil {
		cancelConfig(e.cfg)
		e.cfg = nil
	}
	runs.Delete(e.run.id)
}

// cancelConfig cancels the context caddy.ProvisionContext made for cfg,
// which runs every provisioned module's Cleanup (the rate_limit handlers
// unregister their zones and leave the admin API's listing). Caddy keeps
// that function in an unexported field and offers no other way to undo a
// ProvisionContext; without it (a future Caddy without the field), the
// modules are simply left to the garbage collector.
func cancelConfig(cfg *caddy.Config) {
	f := reflect.ValueOf(cfg).Elem().FieldByName("cancelFunc")
	if !f.IsValid() || f.Type() != reflect.TypeFor[context.CancelCauseFunc]() {
		return
	}
	cancel := *(*context.CancelCauseFunc)(unsafe.Pointer(f.UnsafeAddr()))
	if cancel != nil {
		cancel(context.Canceled)
	}
}

// serverFor picks the server that would have received the request: the
// one given by --server, the only one, or the one listening on the
// request's port (from Host, else 443 over TLS and 80 otherwise).
func (e *Engine) serverFor(req *Request) *simServer {
	if e.fixed != nil {
		return e.fixed
	}
	port := uint(80)
	if req.TLS {
		port = 443
	}
	if _, p, err := net.SplitHostPort(req.Host); err == nil {
		if n, err := strconv.ParseUint(p, 10, 16); err == nil {
			port = uint(n)
		}
	}
	for _, s := range e.servers {
		for _, a := range s.ports {
			if port >= a.StartPort && port <= a.EndPort {
				return s
			}
		}
	}
	return e.servers[0]
}

// Serve runs one request through the production path at its instant. It
// reports false for a request that cannot be built (a malformed URI).
func (e *Engine) Serve(req *Request) bool {
	r, ok := e.build(req)
	if !ok {
		e.bad++
		return false
	}
	if req.Time > e.run.now {
		e.run.now = req.Time
	} else if req.Time < e.run.now {
		e.late++
	}
	e.served++
	if e.served-e.sweepAt >= sweepEvery {
		// Keys back to full hold nothing worth keeping: drop them, so the
		// store holds the keys active within about a window.
		e.sweepAt = e.served
		e.run.mem.Sweep()
	}
	e.w.reset()
	takes := e.run.rec.takes
	e.serverFor(req).srv.ServeHTTP(&e.w, r)
	if e.run.rec.takes == takes {
		e.undecided++
		path, _, _ := strings.Cut(req.URI, "?")
		addTried(&e.triedHosts, req.Host)
		addTried(&e.triedPaths, path)
	}
	return true
}

// addTried adds v to a list of at most maxTried distinct values.
func addTried(list *[]string, v string) {
	if len(*list) < maxTried && !slices.Contains(*list, v) {
		*list = append(*list, v)
	}
}

const sweepEvery = 1 << 18

// build makes the *http.Request of a traffic request.
func (e *Engine) build(req *Request) (*http.Request, bool) {
	uri := req.URI
	if uri == "" {
		uri = "/"
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, false
	}
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	proto := req.Proto
	if proto == "" {
		proto = "HTTP/1.1"
	}
	major, minor, ok := http.ParseHTTPVersion(proto)
	if !ok {
		major, minor, proto = 1, 1, "HTTP/1.1"
	}
	hdr := make(http.Header, len(req.Header))
	for k, v := range req.Header {
		hdr[k] = slices.Clone(v)
	}
	r := &http.Request{
		Method:     method,
		URL:        u,
		Proto:      proto,
		ProtoMajor: major,
		ProtoMinor: minor,
		Header:     hdr,
		Body:       http.NoBody,
		Host:       req.Host,
		RemoteAddr: req.RemoteAddr,
		RequestURI: uri,
	}
	if req.TLS {
		r.TLS = &tls.ConnectionState{HandshakeComplete: true, Version: tls.VersionTLS13, ServerName: req.ServerName}
	}
	if req.UserID != "" || req.Status != 0 || req.HasSettled || len(req.RespHeader) > 0 {
		sim := simulated{user: req.UserID, status: req.Status, header: req.RespHeader}
		if req.HasSettled {
			sim.settled, sim.sources = &req.Settled, e.settleSources()
		}
		r = r.WithContext(context.WithValue(context.Background(), ctxKey{}, sim))
	}
	return r, true
}

// settleSources returns the settle sources of the configuration's zones,
// found once.
func (e *Engine) settleSources() []*zonemodel.Settle {
	if e.sources == nil {
		e.sources = []*zonemodel.Settle{}
		for _, z := range e.rw.zones {
			if z.model != nil && z.model.Settle != nil {
				e.sources = append(e.sources, z.model.Settle)
			}
		}
	}
	return e.sources
}

// discardWriter is the response writer of simulated requests: it keeps
// the status and drops the body.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) reset() {
	if w.h == nil {
		w.h = make(http.Header)
	} else {
		clear(w.h)
	}
	w.status = 0
}

func (w *discardWriter) Header() http.Header { return w.h }

func (w *discardWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return len(b), nil
}

func (w *discardWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
