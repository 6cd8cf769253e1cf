package sluice

import "github.com/sluicehq/caddy-sluice/stores"

// The store contract lives in package stores; these names keep the
// handler's code short.
type (
	// Store is the contract between the handler and a state store
	// (stores.Store).
	Store          = stores.Store
	keyedStore     = stores.Keyed
	refunder       = stores.Refunder
	settler        = stores.Settler
	storePinner    = stores.Pinner
	releaser       = stores.Releaser
	slotHeir       = stores.SlotHeir
	allowanceStore = stores.Allowancer
	adminStore     = stores.Admin
	describedStore = stores.Described
)
