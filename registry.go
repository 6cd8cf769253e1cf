package sluice

import (
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// Zone names are global across one configuration: the same name in two
// handlers is one bucket, so it must carry the same limit and live in the
// same store. caddy-ratelimit silently lets the last definition win, which
// can turn a strict zone into a loose one; here a conflict fails the load.
//
// The Caddyfile adapter checks this too, naming both file:line places; this
// registry catches JSON configurations. It is keyed by the configuration
// being loaded, so the old configuration (still serving during a reload) and
// the new one never conflict with each other.

type zoneUse struct {
	limit algorithms.Limit
	dyn   string // the placeholders of a limit chosen per request
	store string
	refs  int
}

var registry = struct {
	sync.Mutex
	scopes map[any]map[string]*zoneUse
}{scopes: map[any]map[string]*zoneUse{}}

// configScope identifies the configuration a module is being loaded for.
// caddy.Context exposes no config identity, but its FileSystems map is
// created once per loaded configuration and shared by every module of it.
func configScope(ctx caddy.Context) any {
	return ctx.FileSystems()
}

func storeKey(s Store) string {
	if k, ok := s.(keyedStore); ok {
		return k.Key()
	}
	return fmt.Sprintf("%T@%p", s, s)
}

// registerZones records the zones of one handler, failing if a name is
// already used in this configuration with another limit or store.
func registerZones(scope any, zones []*zone, store string) error {
	registry.Lock()
	defer registry.Unlock()
	m := registry.scopes[scope]
	if m == nil {
		m = map[string]*zoneUse{}
		registry.scopes[scope] = m
	}
	for i, z := range zones {
		u := m[z.name]
		if u == nil {
			m[z.name] = &zoneUse{limit: z.limit, dyn: z.dynSpec, store: store, refs: 1}
			continue
		}
		var err error
		switch {
		case u.limit != z.limit || u.dyn != z.dynSpec:
			err = fmt.Errorf("zone %q: defined with %s here but with %s in another rate_limit handler of this config; a zone name is one shared bucket, so every use must carry the same limit (rename one of them)",
				z.name, describeDynamic(z.limit, z.dynSpec), describeDynamic(u.limit, u.dyn))
		case u.store != store:
			err = fmt.Errorf("zone %q: uses store %q here but %q in another rate_limit handler of this config; a zone name is one shared bucket, so every use must use the same store (rename one of them)",
				z.name, store, u.store)
		}
		if err != nil {
			unregisterLocked(scope, zones[:i])
			return err
		}
		u.refs++
	}
	return nil
}

func unregisterZones(scope any, zones []*zone) {
	registry.Lock()
	defer registry.Unlock()
	unregisterLocked(scope, zones)
}

func unregisterLocked(scope any, zones []*zone) {
	m := registry.scopes[scope]
	for _, z := range zones {
		if u := m[z.name]; u != nil {
			if u.refs--; u.refs == 0 {
				delete(m, z.name)
			}
		}
	}
	if len(m) == 0 {
		delete(registry.scopes, scope)
	}
}
