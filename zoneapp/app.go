// Package zoneapp is the rate_limit app, a Caddy app with no
// configuration: the rate_limit handlers of a configuration register their
// zones with it, so that across that configuration one zone name carries
// one limit and one store (a name is one shared bucket).
package zoneapp

import (
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/zonemodel"
)

func init() {
	caddy.RegisterModule(new(App))
}

// App is the rate_limit app. It has no configuration: the rate_limit
// handlers of a configuration load it to check, across that configuration,
// that one zone name carries one limit and one store (a name is one shared
// bucket).
type App struct {
	mu    sync.Mutex
	zones map[string]*zoneUse
}

// Use is one handler's use of a zone name: its limit, and the
// placeholders of a limit chosen per request ("" for a static one).
type Use struct {
	Name    string
	Limit   algorithms.Limit
	Dynamic string
}

// zoneUse is a zone name's limit and store in one configuration.
type zoneUse struct {
	limit algorithms.Limit
	dyn   string // the placeholders of a limit chosen per request
	store string
	refs  int // the handlers using it
}

// CaddyModule returns the Caddy module information.
func (*App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "rate_limit",
		New: func() caddy.Module { return new(App) },
	}
}

// Start does nothing: the app keeps what the handlers share.
func (*App) Start() error { return nil }

// Stop does nothing.
func (*App) Stop() error { return nil }

// Of returns the app of the configuration ctx loads. Caddy makes one
// instance per configuration and drops it with it, so the configuration
// still serving during a reload and the one being loaded never conflict.
func Of(ctx caddy.Context) (*App, error) {
	a, err := ctx.App("rate_limit")
	if err != nil {
		return nil, err
	}
	return a.(*App), nil
}

// Register records the zones of one handler, failing (and recording
// nothing) if a name is already used in this configuration with another
// limit or store.
func (a *App) Register(zones []Use, store string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.zones == nil {
		a.zones = map[string]*zoneUse{}
	}
	for _, z := range zones {
		u := a.zones[z.Name]
		switch {
		case u == nil:
		case u.limit != z.Limit || u.dyn != z.Dynamic:
			return fmt.Errorf("zone %q: defined with %s here but with %s in another rate_limit handler of this config; a zone name is one shared bucket, so every use must carry the same limit (rename one of them)",
				z.Name, zonemodel.DescribeDynamic(z.Limit, z.Dynamic), zonemodel.DescribeDynamic(u.limit, u.dyn))
		case u.store != store:
			return fmt.Errorf("zone %q: uses store %q here but %q in another rate_limit handler of this config; a zone name is one shared bucket, so every use must use the same store (rename one of them)",
				z.Name, store, u.store)
		}
	}
	for _, z := range zones {
		if u := a.zones[z.Name]; u != nil {
			u.refs++
		} else {
			a.zones[z.Name] = &zoneUse{limit: z.Limit, dyn: z.Dynamic, store: store, refs: 1}
		}
	}
	return nil
}

// Unregister releases what Register recorded.
func (a *App) Unregister(zones []Use) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, z := range zones {
		if u := a.zones[z.Name]; u != nil {
			if u.refs--; u.refs == 0 {
				delete(a.zones, z.Name)
			}
		}
	}
}

// Interface guards.
var _ caddy.App = (*App)(nil)
