package algorithms

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestConcurrencyStep(t *testing.T) {
	l, err := NewConcurrencyLimit(3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if l.Capacity() != 3 || l.Window != 60_000 || l.Algorithm.String() != "concurrency" {
		t.Fatalf("limit %+v (%s)", l, l.Algorithm)
	}
	const now = 1_800_000_000_000
	st, fresh := State{}, true
	for i := 1; i <= 3; i++ {
		d, next, fullAt := Step(st, fresh, l, now, 1)
		if !d.Allowed || d.Remaining != int64(3-i) || d.RetryAfter != 0 || d.ResetAfter != 0 || d.Limit != 3 {
			t.Fatalf("take %d: %+v", i, d)
		}
		if next.Debt != int64(i) || next.Alg != Concurrency || fullAt != math.MaxInt64 {
			t.Fatalf("take %d: state %+v, fullAt %d", i, next, fullAt)
		}
		st, fresh = next, false
	}
	d, next, _ := Step(st, false, l, now, 1)
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != ConcurrencyRetry || d.ResetAfter != ConcurrencyRetry {
		t.Fatalf("fourth: %+v, want refused with RetryAfter %v", d, ConcurrencyRetry)
	}
	if next != st {
		t.Fatalf("a refusal changed the state: %+v → %+v", st, next)
	}
	// The view (cost 0) charges nothing.
	if d, next, _ := Step(st, false, l, now, 0); !d.Allowed || d.Remaining != 0 || next != st {
		t.Fatalf("view: %+v, %+v", d, next)
	}
	if d := Peek(st, false, l, now); d.Allowed || d.Remaining != 0 || d.RetryAfter != ConcurrencyRetry {
		t.Fatalf("Peek of a full key: %+v", d)
	}
	if d := Peek(State{Alg: Concurrency, Debt: 1}, false, l, now); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("Peek of one slot in use: %+v", d)
	}
	// No slot in use: forgettable now.
	if _, next, fullAt := Step(State{}, true, l, now, 0); next.Debt != 0 || fullAt != now {
		t.Fatalf("an empty key: %+v, fullAt %d", next, fullAt)
	}
	// A lowered limit refuses until enough requests end; a raised one
	// admits at once.
	lower, _ := NewConcurrencyLimit(2, time.Minute)
	if d, _, _ := Step(st, false, lower, now, 1); d.Allowed || d.Remaining != 0 {
		t.Fatalf("3 in use under a limit of 2: %+v", d)
	}
	higher, _ := NewConcurrencyLimit(5, time.Minute)
	if d, next, _ := Step(st, false, higher, now, 1); !d.Allowed || d.Remaining != 1 || next.Debt != 4 {
		t.Fatalf("3 in use under a limit of 5: %+v %+v", d, next)
	}
	// A rate algorithm's state is no slot in use.
	if d, next, _ := Step(State{Alg: TokenBucket, Debt: 99}, false, l, now, 1); !d.Allowed || next.Debt != 1 {
		t.Fatalf("over a token bucket's state: %+v %+v", d, next)
	}
}

func TestConcurrencyValidate(t *testing.T) {
	for _, c := range []struct {
		l    Limit
		want error
	}{
		{Limit{Algorithm: Concurrency, Events: 1, Window: MinLease}, nil},
		{Limit{Algorithm: Concurrency, Events: MaxConcurrent, Window: MaxLease}, nil},
		{Limit{Algorithm: Concurrency, Events: 0, Window: 60_000}, ErrConcurrent},
		{Limit{Algorithm: Concurrency, Events: MaxConcurrent + 1, Window: 60_000}, ErrConcurrent},
		{Limit{Algorithm: Concurrency, Events: 3, Window: MinLease - 1}, ErrLease},
		{Limit{Algorithm: Concurrency, Events: 3, Window: MaxLease + 1}, ErrLease},
		{Limit{Algorithm: Concurrency, Events: 3, Window: 60_000, Burst: 4}, ErrBurstNotAllowed},
		{Limit{Algorithm: Concurrency, Events: 3, Window: 60_000, Penalty: 1000}, ErrPenalty},
		{Limit{Algorithm: Concurrency, Events: 3, Window: 60_000, Delay: 1000}, ErrDelayNotAllowed},
		{Limit{Algorithm: Concurrency, Events: 3, Window: 60_000, DelayAfter: 1}, ErrDelayNotAllowed},
	} {
		if err := c.l.Validate(); !errors.Is(err, c.want) && (err != nil || c.want != nil) {
			t.Errorf("%+v: Validate() = %v, want %v", c.l, err, c.want)
		}
	}
	if _, err := ParseAlgorithm("concurrency"); err == nil {
		t.Error(`ParseAlgorithm("concurrency") succeeded: a concurrency zone is configured by concurrent, not algorithm`)
	}
}
