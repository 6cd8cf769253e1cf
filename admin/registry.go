package admin

import (
	"cmp"
	"slices"
	"sync"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
)

// Zone is one zone of a registered handler, as the admin API and the live
// page read it: values and the two calls that need the zone's live state.
type Zone struct {
	Name    string
	Deriver *identity.Deriver
	Limit   algorithms.Limit
	// Store is the handler's store; Local its fail-local memory store (nil
	// when it has none).
	Store, Local any
	// InFlight: the zone's charges stay in flight until the response
	// (count, settle), so a peek reads the units in flight first.
	InFlight bool
	// Info returns the zone's listing; its Enabled and Store are filled in
	// here.
	Info func() ZoneInfo
	// Peek adds the zone's own fields to a peek (slots in use, debt); nil
	// when it has none.
	Peek func(p *Peek)
	// MaxOverrides bounds the zone's overrides (0: zonemodel.DefaultMaxOverrides);
	// OverridesInForce is told their count whenever it is read (nil:
	// nobody listens). overrides.go.
	MaxOverrides     int
	OverridesInForce func(n int)
	// Sync: the zone decides asynchronously (its zone's sync), from counts
	// its store's script never overrides, so it takes no override.
	Sync bool
}

// The registry: every registered handler, by configuration. The active
// configuration is the one registered last whose handlers are still
// registered: a configuration being loaded replaces the running one in the
// listing as soon as it is provisioned; if it fails to load, its handlers'
// Cleanup removes it and the running one shows again; once it runs, the old
// one's Cleanup removes the old handlers.
var registry = struct {
	sync.Mutex
	next     uint64
	gens     map[any]uint64 // configuration → generation
	handlers map[any]entry
}{gens: map[any]uint64{}, handlers: map[any]entry{}}

type entry struct {
	config  any    // the configuration's
	gen     uint64 // the configuration's generation
	order   uint64 // the handler's, within it
	enabled bool
	zones   []Zone
}

// Register records a provisioned handler (any comparable value naming it)
// of configuration config (likewise), with its zones; enabled is the
// handler's enabled setting. A handler registered again for the same
// configuration keeps its place, with the zones given now.
func Register(config, handler any, enabled bool, zones []Zone) {
	r := &registry
	r.Lock()
	defer r.Unlock()
	if e, ok := r.handlers[handler]; ok && e.config == config {
		e.enabled, e.zones = enabled, zones
		r.handlers[handler] = e
		return
	}
	r.next++
	gen, ok := r.gens[config]
	if !ok {
		gen = r.next
		r.gens[config] = gen
	}
	r.handlers[handler] = entry{config: config, gen: gen, order: r.next, enabled: enabled, zones: zones}
	startSweep()
}

// Unregister forgets a handler (a no-op if it was never registered).
func Unregister(handler any) {
	r := &registry
	r.Lock()
	defer r.Unlock()
	e, ok := r.handlers[handler]
	if !ok {
		return
	}
	delete(r.handlers, handler)
	for _, o := range r.handlers {
		if o.config == e.config {
			return
		}
	}
	delete(r.gens, e.config)
}

// activeHandlers returns the handlers of the active configuration, in the
// order they were registered.
func activeHandlers() []entry {
	r := &registry
	r.Lock()
	defer r.Unlock()
	var gen uint64
	for _, e := range r.handlers {
		gen = max(gen, e.gen)
	}
	var hs []entry
	for _, e := range r.handlers {
		if e.gen == gen {
			hs = append(hs, e)
		}
	}
	slices.SortFunc(hs, func(a, b entry) int { return cmp.Compare(a.order, b.order) })
	return hs
}

// activeZone is one zone of the active configuration, as the first handler
// that uses it registered it (every use shares the limit and the store).
type activeZone struct {
	Zone
	enabled bool // some handler using it is enabled
}

// activeZones returns the zones of the active configuration by name.
func activeZones() map[string]*activeZone {
	out := map[string]*activeZone{}
	for _, h := range activeHandlers() {
		for _, z := range h.zones {
			az := out[z.Name]
			if az == nil {
				az = &activeZone{Zone: z}
				out[z.Name] = az
			}
			az.enabled = az.enabled || h.enabled
		}
	}
	return out
}
