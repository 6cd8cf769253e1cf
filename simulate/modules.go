package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/stores"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

func init() {
	caddy.RegisterModule(Store{})
	caddy.RegisterModule(Auth{})
	caddy.RegisterModule(Upstream{})
}

// Module names of the simulator's two guest modules. They load only inside
// a simulation (a run registered by this process); a configuration that
// names them otherwise is refused at load.
const (
	storeModuleName = "simulate"
	authHandlerName = "rate_limit_simulate_auth"
	// upstreamHandlerName replaces an upstream (reverse_proxy,
	// file_server): it answers with the traffic's logged status.
	upstreamHandlerName = "rate_limit_simulate_upstream"
)

// runs maps a simulation's id to its state, for the modules its
// configuration loads.
var runs sync.Map // string → *run

// Store is the simulator's rate limit store
// (http.handlers.rate_limit.stores.simulate): the memory store on the
// simulation's virtual clock, recording every decision for the report. It
// exists only inside `caddy rate-limit simulate`.
type Store struct {
	// Run is the simulation the store belongs to.
	Run string `json:"run,omitempty"`

	run  *run
	take stores.Store // the memory store under the recording layer
}

// CaddyModule returns the Caddy module information.
func (Store) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit.stores." + storeModuleName,
		New: func() caddy.Module { return new(Store) },
	}
}

// Provision attaches the store to its simulation.
func (s *Store) Provision(caddy.Context) error {
	v, ok := runs.Load(s.Run)
	if !ok {
		return errors.New("store simulate: only `caddy rate-limit simulate` uses this store")
	}
	s.run = v.(*run)
	s.take = stores.Stack(s.run.mem, s.recordLayer)
	return nil
}

// Key identifies the store: every handler of one simulation shares it.
func (s *Store) Key() string { return "simulate run=" + s.Run }

// Take decides with the memory store at the virtual instant, under the
// recording layer.
func (s *Store) Take(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
	return s.take.Take(ctx, reqs, out)
}

// recordLayer records every decision of next for the report. A request
// admitted later (a `delay` zone) waits in virtual time: its reservation
// is charged at its arrival, as in production, and the handler is told not
// to hold it up in real time.
func (s *Store) recordLayer(next stores.Store) stores.Store {
	return stores.TakeFunc(func(ctx context.Context, reqs []algorithms.Request, out []algorithms.Decision) error {
		if err := next.Take(ctx, reqs, out); err != nil {
			return err
		}
		s.run.rec.record(s.run.now, reqs, out)
		for i := range out {
			out[i].Delay = 0
		}
		return nil
	})
}

// Refund gives back the charges of `count` zones whose response status
// does not count, in the memory store, as production does.
func (s *Store) Refund(ctx context.Context, refunds []algorithms.Refund) error {
	return s.run.mem.Refund(ctx, refunds)
}

// Settle settles the charges of `settle` zones to the amounts the
// traffic reported, in the memory store, as production does.
func (s *Store) Settle(ctx context.Context, refunds []algorithms.Refund) error {
	return s.run.mem.Settle(ctx, refunds)
}

// Release gives back the slots of concurrency zones, in the memory store,
// as production does when a request ends. The replay is sequential: a
// request's response is written before the next request arrives, so its
// slots come back at once.
func (s *Store) Release(ctx context.Context, reqs []algorithms.Request) error {
	return s.run.mem.Release(ctx, reqs)
}

// ctxKey carries what the traffic says of a simulated request (its user,
// its upstream's status) into Auth and Upstream.
type ctxKey struct{}

// simulated is the value under ctxKey.
type simulated struct {
	user   string
	status int
	// header: response headers to send; settled: the amount to report in
	// every settle source (nil: none).
	header  http.Header
	settled *int64
	sources []*zonemodel.Settle
}

// Upstream replaces an upstream handler in a simulation
// (http.handlers.rate_limit_simulate_upstream): it answers with the status
// the traffic logged (200 when there is none), so that a `count` zone
// keeps or gives back its charge as it did in production. It exists only
// inside a simulation.
type Upstream struct{}

// CaddyModule returns the Caddy module information.
func (Upstream) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers." + upstreamHandlerName,
		New: func() caddy.Module { return new(Upstream) },
	}
}

// Provision refuses to load outside a simulation.
func (u *Upstream) Provision(caddy.Context) error {
	if !inSimulation() {
		return errors.New("handler " + upstreamHandlerName + ": only `caddy rate-limit simulate` uses this handler")
	}
	return nil
}

// ServeHTTP answers with the logged status.
func (Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	sim, _ := r.Context().Value(ctxKey{}).(simulated)
	status := sim.status
	if status < 100 || status > 999 {
		status = http.StatusOK
	}
	for k, v := range sim.header {
		w.Header()[k] = v
	}
	var body map[string]any
	if sim.settled != nil {
		n := *sim.settled
		for _, src := range sim.sources {
			if src.Header != "" {
				w.Header().Set(src.Header, strconv.FormatInt(n, 10))
				continue
			}
			if body == nil {
				body = map[string]any{}
			}
			// The amount in the first term, 0 in the others (a sum's).
			paths, terms, _ := src.Paths()
			for i, p := range paths {
				if i > 0 && terms[i] == terms[i-1] {
					continue // an alternative of the same term
				}
				v := n
				if terms[i] > 0 {
					v = 0
				}
				setPath(body, p, v)
			}
		}
	}
	if body == nil {
		w.WriteHeader(status)
		return nil
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, err = w.Write(b)
	return err
}

// setPath sets the value at a dot path of m, making the objects on the
// way (a value already there that is not an object is replaced).
func setPath(m map[string]any, path []string, v int64) {
	for _, seg := range path[:len(path)-1] {
		next, ok := m[seg].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[seg] = next
		}
		m = next
	}
	m[path[len(path)-1]] = v
}

// Auth replaces an authentication handler in a simulation
// (http.handlers.rate_limit_simulate_auth): the user id comes from the
// traffic (an access log's user_id, a CSV key), so {http.auth.user.id} is
// what it was; a request without one is refused with 401, as the real
// authentication refused it. It exists only inside a simulation.
type Auth struct{}

// CaddyModule returns the Caddy module information.
func (Auth) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers." + authHandlerName,
		New: func() caddy.Module { return new(Auth) },
	}
}

// Provision refuses to load outside a simulation.
func (a *Auth) Provision(ctx caddy.Context) error {
	if !inSimulation() {
		return errors.New("handler rate_limit_simulate_auth: only `caddy rate-limit simulate` uses this handler")
	}
	return nil
}

// inSimulation reports whether a simulation is being set up or running.
func inSimulation() bool {
	n := 0
	runs.Range(func(_, _ any) bool { n++; return false })
	return n > 0
}

// ServeHTTP sets the user id or refuses.
func (a *Auth) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	sim, _ := r.Context().Value(ctxKey{}).(simulated)
	user := sim.user
	if user == "" {
		return caddyhttp.Error(http.StatusUnauthorized, fmt.Errorf("simulated authentication: the request has no user id"))
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	repl.Set("http.auth.user.id", user)
	return next.ServeHTTP(w, r)
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Store)(nil)
	_ stores.Store                = (*Store)(nil)
	_ stores.Keyed                = (*Store)(nil)
	_ stores.Refunder             = (*Store)(nil)
	_ stores.Settler              = (*Store)(nil)
	_ stores.Releaser             = (*Store)(nil)
	_ caddy.Provisioner           = (*Auth)(nil)
	_ caddyhttp.MiddlewareHandler = (*Auth)(nil)
	_ caddy.Provisioner           = (*Upstream)(nil)
	_ caddyhttp.MiddlewareHandler = (*Upstream)(nil)
)
