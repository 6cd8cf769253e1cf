package sluice

import (
	"slices"
	"testing"
)

// TestControlsJoinOnlyTheirStages: a directive with only a rate zone joins
// no stage (its requests run no control's hook); with every control on,
// each stage runs the hooks of the controls that declared it, in the
// table's order; and every control in the table is named once.
func TestControlsJoinOnlyTheirStages(t *testing.T) {
	plain := newHandler(t, `rate_limit {
		zone ctl_plain {
			events 10
			window 1m
		}
	}`, nil)
	for s, joined := range plain.on {
		if len(joined) != 0 {
			t.Errorf("a rate zone alone: %d controls joined stage %d", len(joined), s)
		}
	}

	all := newHandler(t, `rate_limit {
		zone ctl_rate {
			events 10
			window 1m
			count 5xx
			penalty 1s
			delay 1s
		}
		zone ctl_conc {
			concurrent 3
		}
		zone ctl_soft {
			events 10
			window 1m
			on_exceed pass
		}
		zone ctl_tokens {
			events 1000
			window 1m
			cost 10
			settle json usage.total_tokens
		}
	}`, nil)
	want := [numStages][]*control{
		atPlan:    {&concurrencyControl}, // the holder id
		atAdmit:   {&delayControl},       // the waiting room
		atDecided: {&inflightControl},    // the wait for charges in flight
		atRank:    {&concurrencyControl}, // the Retry-After hint
		atVerdict: {&countControl, &settleControl, &passControl, &delayControl, &concurrencyControl},
		atServe:   {&passControl, &delayControl},                     // pass marks before a delay waits
		atStatus:  {&countControl, &settleControl, &inflightControl}, // settle: its free statuses
		atBody:    {&settleControl},                                  // the amount read as the body streams
		atExit:    {&settleControl, &concurrencyControl},             // settled, then the slots back
	}
	for s := range numStages {
		if !slices.Equal(all.on[s], want[s]) {
			t.Errorf("every control on, stage %d: %s, want %s", s, names(all.on[s]), names(want[s]))
		}
	}

	seen := map[string]bool{}
	for _, c := range controls {
		if c.name == "" || seen[c.name] {
			t.Errorf("control %q: every control needs a name of its own", c.name)
		}
		seen[c.name] = true
	}
}

// names lists the controls' names.
func names(cs []*control) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.name)
	}
	return out
}

// TestControlsProvisionInAnyOrder: a directive with every control on,
// its controls provisioned in every order, joins the same stages with the
// same hooks, plans the same requests and holds its store alike: no
// control reads what another's provision sets (what follows from them,
// charges in flight and the store hold, is derived once all are done).
func TestControlsProvisionInAnyOrder(t *testing.T) {
	h := newHandler(t, `rate_limit {
		settle_wait 2s
		zone ord_rate {
			events 10
			window 1m
			count 5xx
			penalty 1s
			delay 1s
		}
		zone ord_conc {
			concurrent 3
		}
		zone ord_soft {
			events 10
			window 1m
			on_exceed pass
		}
		zone ord_tokens {
			key {http.rate_limit.request_json.user}
			events 1000
			window 1m
			cost 10
			settle json usage.total_tokens
		}
		zone ord_adaptive {
			concurrent adaptive
		}
	}`, nil)
	want, wantPlanned, wantPin := h.on, slices.Clone(h.planned), h.pin
	if len(want[atDecided]) == 0 || len(want[atExit]) != 3 {
		t.Fatalf("the table's order: decided %s, exit %s; want the wait for charges in flight, and settle, concurrency, adaptive", names(want[atDecided]), names(want[atExit]))
	}
	var order []*control // those with a provision: the others cannot depend on one
	for _, c := range controls {
		if c.provision != nil || c.derive != nil {
			order = append(order, c)
		}
	}
	orders := 0
	permute(order, len(order), func() {
		orders++
		h.cleanupControls()
		h.planned = plannedOf(h.zones)
		if err := h.provisionIn(order); err != nil {
			t.Fatalf("order %s: %v", names(order), err)
		}
		h.decider = h.decideStage() // derives FailApart
		for s := range numStages {
			if !slices.Equal(h.on[s], want[s]) {
				t.Fatalf("order %s, stage %d: %s, want %s", names(order), s, names(h.on[s]), names(want[s]))
			}
		}
		if !slices.Equal(h.planned, wantPlanned) || h.pin != wantPin {
			t.Fatalf("order %s: planned %+v, pin %v; want %+v, %v", names(order), h.planned, h.pin, wantPlanned, wantPin)
		}
	})
	if f := factorial(len(order)); len(order) < 8 || orders != f {
		t.Errorf("%d orders tried, want %d", orders, f)
	}
}

// permute calls f on every order of s[:n] (Heap's algorithm).
func permute[T any](s []T, n int, f func()) {
	if n <= 1 {
		f()
		return
	}
	for i := range n - 1 {
		permute(s, n-1, f)
		if n%2 == 0 {
			s[i], s[n-1] = s[n-1], s[i]
		} else {
			s[0], s[n-1] = s[n-1], s[0]
		}
	}
	permute(s, n-1, f)
}

func factorial(n int) int {
	if n <= 1 {
		return 1
	}
	return n * factorial(n-1)
}
