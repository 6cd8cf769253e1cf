package sluice

import (
	"fmt"

	"github.com/sluicehq/caddy-sluice/zoneapp"
)

// App is the rate_limit app (package zoneapp), with which the handlers of
// a configuration register their zones' names, limits and stores.
type App = zoneapp.App

// zoneUses are h's zones as the app checks them.
func zoneUses(h *Handler) []zoneapp.Use {
	uses := make([]zoneapp.Use, len(h.zones))
	for i, z := range h.zones {
		uses[i] = zoneapp.Use{Name: z.name, Limit: z.limit, Dynamic: z.dynSpec}
	}
	return uses
}

func storeKey(s Store) string {
	if k, ok := s.(keyedStore); ok {
		return k.Key()
	}
	return fmt.Sprintf("%T@%p", s, s)
}
