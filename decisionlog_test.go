package sluice

import (
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// decisionLogControl is a control written only for a test: the zones it
// is given (logged) log their decisions. It is what a new control needs:
// this file, and one line registering it (registerControl). It joins the
// lifecycle at compile, provision, plan, rank, exit and cleanup.
var decisionLogControl = control{
	name: "decision_log",
	compile: func(z *zone, _ *Zone) error {
		decisionLog.note(func(l *decisionLogState) {
			if l.logged[z.name] {
				l.compiled++
			}
		})
		return nil
	},
	provision: func(h *Handler) (stages, error) {
		if !slices.ContainsFunc(h.zones, func(z *zone) bool { return decisionLog.isLogged(z.name) }) {
			return 0, nil
		}
		return joins(atPlan, atRank, atExit), nil
	},
	cleanup: func(h *Handler) {
		if slices.ContainsFunc(h.zones, func(z *zone) bool { return decisionLog.isLogged(z.name) }) {
			decisionLog.note(func(l *decisionLogState) { l.cleanups++ })
		}
	},
	hooks: hooks{
		plan: func(_ *admission, z *zone, _ *algorithms.Request) {
			decisionLog.note(func(l *decisionLogState) {
				if l.logged[z.name] {
					l.planned++
				}
			})
		},
		rank: func(a *admission) {
			decisionLog.note(func(l *decisionLogState) {
				for i, z := range a.zones {
					switch {
					case !l.logged[z.name]:
					case a.decs[i].Allowed:
						l.allowed++
					default:
						l.refused++
					}
				}
			})
		},
		exit: func(a *admission) {
			decisionLog.note(func(l *decisionLogState) { l.exits++ })
		},
	},
}

// decisionLog is the control's record, shared by the handlers of a test.
var decisionLog decisionLogger

type decisionLogger struct {
	mu sync.Mutex
	decisionLogState
}

// note records, under the lock.
func (d *decisionLogger) note(f func(*decisionLogState)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(&d.decisionLogState)
}

func (d *decisionLogger) isLogged(zone string) (logged bool) {
	d.note(func(l *decisionLogState) { logged = l.logged[zone] })
	return logged
}

// reset starts a record of the zones given.
func (d *decisionLogger) reset(zones ...string) {
	d.note(func(l *decisionLogState) {
		*l = decisionLogState{logged: map[string]bool{}}
		for _, z := range zones {
			l.logged[z] = true
		}
	})
}

// state returns a copy of the record.
func (d *decisionLogger) state() (s decisionLogState) {
	d.note(func(l *decisionLogState) { s = *l })
	return s
}

// decisionLogState is what the control saw: the zones it logs, and how
// many times each hook ran for them.
type decisionLogState struct {
	logged                                               map[string]bool
	compiled, planned, allowed, refused, exits, cleanups int
}

// registerControl adds c to the end of the registration table for the
// test's length: the one line a control registers with.
func registerControl(t *testing.T, c *control) {
	controls = append(controls, c)
	t.Cleanup(func() { controls = slices.DeleteFunc(controls, func(x *control) bool { return x == c }) })
}

// TestNewControlRunsInTheLifecycle: a control written in a test file and
// registered by one line runs in every stage it joins, for its zones only:
// C concurrent requests over a limit of N are each planned once, N
// decisions allowed and C-N refused, N exits; the handler's cleanup
// reaches it; a directive without its zones runs none of its hooks.
func TestNewControlRunsInTheLifecycle(t *testing.T) {
	registerControl(t, &decisionLogControl)
	decisionLog.reset("ctl_logged")
	t.Cleanup(func() { // after the handlers' cleanups
		if got := decisionLog.state().cleanups; got != 1 {
			t.Errorf("the control's cleanup ran %d times for its handler, want 1", got)
		}
	})

	other := newHandler(t, `rate_limit {
		zone ctl_unlogged {
			events 10
			window 1m
		}
	}`, nil)
	for s, joined := range other.on {
		if slices.Contains(joined, &decisionLogControl) {
			t.Errorf("a directive without a logged zone joined stage %d", s)
		}
	}

	const n, c = 10, 25
	h := newHandler(t, `rate_limit {
		zone ctl_logged {
			key {http.request.header.X-User}
			events 10
			window 1m
		}
	}`, nil)
	var wg sync.WaitGroup
	codes := make(chan int, c)
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := serveNext(t, h, okHandler, map[string]string{"X-User": "u"})
			if err != nil {
				codes <- errorStatus(err)
				return
			}
			codes <- w.Code
		}()
	}
	wg.Wait()
	close(codes)
	ok := 0
	for code := range codes {
		if code == http.StatusOK {
			ok++
		}
	}
	if ok != n {
		t.Fatalf("%d of %d requests allowed, want %d", ok, c, n)
	}
	got := decisionLog.state()
	t.Logf("the control saw %+v", got)
	if got.compiled == 0 || got.planned != c || got.allowed != n || got.refused != c-n || got.exits != n {
		t.Fatalf("the control saw compiled %d, planned %d, allowed %d, refused %d, exits %d; want compiled, and %d, %d, %d, %d",
			got.compiled, got.planned, got.allowed, got.refused, got.exits, c, n, c-n, n)
	}
}
