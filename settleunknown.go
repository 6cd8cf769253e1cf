package sluice

import (
	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
)

// unknownRule is what a settle zone charges a 2xx response (or one whose
// client left before its status) when its amount never arrives: the
// client left before the usage event, the upstream stopped, the amount was
// unusable. Without the rule such a response would pay only its estimate,
// and leaving early would be a way round the budget.
type unknownRule struct {
	// from is the placeholder read (the request's max_tokens), nil for a
	// fixed amount; amount is added to it, or is the charge alone; both
	// unset: the default (charge).
	from   *identity.Candidate
	amount int64
}

// compile reads the rule of s (zonemodel checked it).
func (u *unknownRule) compile(s *Settle) error {
	u.amount = s.Unknown
	if s.UnknownFrom == "" {
		return nil
	}
	c, err := identity.Compile(s.UnknownFrom)
	if err != nil {
		return err
	}
	u.from = &c
	return nil
}

// readsRequest reports whether the rule may fall back on the default,
// which reads the request's body (all but a fixed amount).
func (u *unknownRule) readsRequest() bool { return u.from != nil || u.amount == 0 }

// charge returns what a response of a's request without an amount is
// charged, with estimate its estimate: never less than the estimate, at
// most algorithms.MaxSettled. The default, and a placeholder without a usable value:
// a request that bounds its output (st.bound) is charged that bound plus
// its body's length (a text has no more tokens than bytes), so leaving
// early never costs less than staying; one that does not, its body's
// length plus the response's bytes read.
func (u *unknownRule) charge(a *admission, st *settlement, estimate int64) int64 {
	n := st.bodyLen + st.seen
	if st.bound > 0 {
		n = st.bound + st.bodyLen
	}
	switch {
	case u.from != nil:
		a.repl.r = a.r
		v, ok := u.from.AppendValue(&a.repl, a.buf[:0])
		a.buf = v
		if f, good := parseCount(v); ok && good {
			n = f + u.amount
		}
	case u.amount > 0:
		n = u.amount
	}
	return max(min(n, algorithms.MaxSettled), estimate)
}
