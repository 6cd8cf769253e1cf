// Package vectortest loads Sluice's shared algorithm test vectors
// (algorithms/testdata/*.json), so that the Go step functions, the memory
// store and the Lua twin in Redis are checked against the same files. It is
// for tests only.
package vectortest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// DefaultBase is the instant step times are counted from unless a vector
// sets base_ms: a UTC midnight (2026-05-28), so it is a multiple of every
// window that divides a day, and fixed windows start at offset 0.
const DefaultBase = int64(1_779_926_400_000)

// Limit is a vector's limit as written in the file.
type Limit struct {
	Algorithm string `json:"algorithm"`
	Events    int64  `json:"events"`
	WindowMs  int64  `json:"window_ms"`
	Burst     int64  `json:"burst"`
	PenaltyMs int64  `json:"penalty_ms,omitempty"`
	DelayMs   int64  `json:"delay_ms,omitempty"`
	// DelayAfter is the limit's delay_after (tokens).
	DelayAfter int64 `json:"delay_after,omitempty"`
}

// Compile checks the limit and returns its compiled form.
func (l Limit) Compile() (algorithms.Limit, error) {
	alg, err := algorithms.ParseAlgorithm(l.Algorithm)
	if err != nil {
		return algorithms.Limit{}, err
	}
	lim, err := algorithms.NewLimit(alg, l.Events, time.Duration(l.WindowMs)*time.Millisecond, l.Burst)
	if err != nil {
		return lim, err
	}
	lim.Penalty, lim.Delay, lim.DelayAfter = l.PenaltyMs, l.DelayMs, l.DelayAfter
	return lim, lim.Validate()
}

// Step is one request of a vector and the decision it must get; or, with
// Refund, the refund of a charge of Cost made at ChargedAtMs (an offset
// from the base; absent: unknown), which must leave the key showing the
// decision given (the key's view after it, as a request of cost 0 gets it).
type Step struct {
	AtMs        int64  `json:"at_ms"` // offset from the base
	Cost        int64  `json:"cost"`
	Refund      bool   `json:"refund,omitempty"`
	ChargedAtMs *int64 `json:"charged_at_ms,omitempty"`
	// Settle, when set, makes the step the settle of a charge of Cost made
	// at ChargedAtMs to this actual amount (algorithms.Settle), checked as a
	// refund step is.
	Settle       *int64 `json:"settle,omitempty"`
	NoDelay      bool   `json:"no_delay,omitempty"` // the request may not wait (Request.NoDelay)
	Limit        *Limit `json:"limit,omitempty"`    // a changed limit, from this step on
	Allowed      bool   `json:"allowed"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	DelayMs      int64  `json:"delay_ms,omitempty"` // an admission's wait (Decision.Delay)
	Note         string `json:"note,omitempty"`
}

// Vector is a named sequence of requests against one key.
type Vector struct {
	Name   string `json:"name"`
	Note   string `json:"note,omitempty"`
	BaseMs int64  `json:"base_ms,omitempty"`
	Limit  Limit  `json:"limit"`
	Steps  []Step `json:"steps"`

	File string `json:"-"`
}

// Base returns the instant at_ms counts from.
func (v *Vector) Base() int64 {
	if v.BaseMs != 0 {
		return v.BaseMs
	}
	return DefaultBase
}

// Compiled is a vector's steps with their limits compiled and times made
// absolute.
type Compiled struct {
	Now   int64
	Cost  int64
	Limit algorithms.Limit
	Want  Want
	Step  Step
	// Refund marks a refund step; At is its charge's instant (0: unknown).
	Refund bool
	At     int64
	// Settle marks a settle step, to Settled units.
	Settle  bool
	Settled int64
}

// Request is the step's request (zone and key left empty).
func (c *Compiled) Request() *algorithms.Request {
	return &algorithms.Request{Limit: c.Limit, Cost: c.Cost, NoDelay: c.Step.NoDelay}
}

// Want is the decision a step must get, in a comparable form.
type Want struct {
	Allowed                                        bool
	Remaining, RetryAfterMs, ResetAfterMs, DelayMs int64
}

// Got converts a decision for comparison with Want.
func Got(d algorithms.Decision) Want {
	return Want{Allowed: d.Allowed, Remaining: d.Remaining,
		RetryAfterMs: d.RetryAfter.Milliseconds(), ResetAfterMs: d.ResetAfter.Milliseconds(), DelayMs: d.Delay.Milliseconds()}
}

// Compile returns the vector's steps ready to run, or fails t.
func (v *Vector) Compile(t testing.TB) []Compiled {
	t.Helper()
	l, err := v.Limit.Compile()
	if err != nil {
		t.Fatalf("%s %q: limit: %v", v.File, v.Name, err)
	}
	out := make([]Compiled, 0, len(v.Steps))
	for i, s := range v.Steps {
		if s.Limit != nil {
			if l, err = s.Limit.Compile(); err != nil {
				t.Fatalf("%s %q step %d: limit: %v", v.File, v.Name, i, err)
			}
		}
		if s.Cost < 1 {
			t.Fatalf("%s %q step %d: cost %d", v.File, v.Name, i, s.Cost)
		}
		if i > 0 && s.AtMs < v.Steps[i-1].AtMs {
			t.Fatalf("%s %q step %d: time goes back", v.File, v.Name, i)
		}
		c := Compiled{Now: v.Base() + s.AtMs, Cost: s.Cost, Limit: l, Step: s, Refund: s.Refund,
			Want: Want{s.Allowed, s.Remaining, s.RetryAfterMs, s.ResetAfterMs, s.DelayMs}}
		if s.Settle != nil {
			c.Settle, c.Settled = true, *s.Settle
		}
		if s.ChargedAtMs != nil {
			c.At = v.Base() + *s.ChargedAtMs
		}
		out = append(out, c)
	}
	return out
}

// Dir returns the directory holding the vector files.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata")
}

// Load returns every vector of every file, or fails t. It also fails when
// an algorithm has fewer than minPerAlgorithm vectors.
func Load(t testing.TB) []Vector {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(Dir(), "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no vector files in %s (%v)", Dir(), err)
	}
	slices.Sort(files)
	var all []Vector
	per := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var vs []Vector
		if err := json.Unmarshal(b, &vs); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for i := range vs {
			vs[i].File = filepath.Base(f)
			if len(vs[i].Steps) == 0 {
				t.Fatalf("%s %q: no steps", f, vs[i].Name)
			}
			per[vs[i].Limit.Algorithm]++
		}
		all = append(all, vs...)
	}
	for _, name := range []string{"token_bucket", "gcra", "sliding_window", "fixed_window", "sliding_log"} {
		if per[name] < minPerAlgorithm {
			t.Fatalf("only %d vectors for %s, want at least %d", per[name], name, minPerAlgorithm)
		}
	}
	return all
}

const minPerAlgorithm = 4
