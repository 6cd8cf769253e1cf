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
		atTake:    {&inflightControl},    // the wait for charges in flight
		atRank:    {&concurrencyControl}, // the Retry-After hint
		atVerdict: {&countControl, &settleControl, &passControl, &delayControl, &concurrencyControl},
		atServe:   {&passControl, &delayControl},                     // pass marks before a delay waits
		atStatus:  {&countControl, &settleControl, &inflightControl}, // settle notes the status for its unknown rule
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
