package sluice

import "sync"

// after is what a decided request leaves to do once the handler chain after
// this one has returned, whatever way it returned: normally, with an
// error, in a panic, with the client gone, or at the end of a streamed
// response (the chain returns when the last byte is written). ServeHTTP
// runs it (finish) in a defer; a request with nothing to do has none (nil)
// and pays nothing. What it does must not hold the response up: a store
// call it makes is queued, not waited for.
//
// Its parts: the concurrency slots to give back (concurrency.go). Work
// that depends on how the response went (a refund by status) joins here,
// with what it needs recorded before the chain runs.
type after struct {
	slots heldSlots
}

var afterPool = sync.Pool{New: func() any { return new(after) }}

func getAfter() *after { return afterPool.Get().(*after) }

// finish runs a's work and recycles it.
func (h *Handler) finish(a *after) {
	h.releaseSlots(&a.slots)
	afterPool.Put(a)
}
