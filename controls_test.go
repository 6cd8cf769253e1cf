package sluice

import (
	"reflect"
	"runtime"
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
	if plain.stages != 0 || len(plain.on.plan)+len(plain.on.admit)+len(plain.on.take)+len(plain.on.rank)+
		len(plain.on.verdict)+len(plain.on.serve)+len(plain.on.status)+len(plain.on.exit) != 0 {
		t.Errorf("a rate zone alone joined stages %b: %+v", plain.stages, plain.on)
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
	}`, nil)
	want := map[string]int{
		"plan":    1, // concurrency: the holder id
		"admit":   1, // delay: the waiting room
		"take":    1, // charges in flight
		"rank":    1, // concurrency: the Retry-After hint
		"verdict": 4, // count, pass, delay, concurrency
		"serve":   2, // pass, delay
		"status":  2, // count, charges in flight
		"exit":    1, // concurrency: the slots back
	}
	got := map[string]int{"plan": len(all.on.plan), "admit": len(all.on.admit), "take": len(all.on.take), "rank": len(all.on.rank),
		"verdict": len(all.on.verdict), "serve": len(all.on.serve), "status": len(all.on.status), "exit": len(all.on.exit)}
	for stage, n := range want {
		if got[stage] != n {
			t.Errorf("every control on: %d hooks at %s, want %d", got[stage], stage, n)
		}
	}
	// Pass marks before a delay waits: a waiter that leaves still carries
	// its marks.
	if len(all.on.serve) == 2 && funcName(all.on.serve[0]) != funcName(markPass) {
		t.Errorf("the first serve hook is %s, want markPass", funcName(all.on.serve[0]))
	}

	seen := map[string]bool{}
	for _, c := range controls {
		if c.name == "" || seen[c.name] {
			t.Errorf("control %q: every control needs a name of its own", c.name)
		}
		seen[c.name] = true
	}
}

// funcName names a function value.
func funcName(f any) string {
	return runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name()
}
