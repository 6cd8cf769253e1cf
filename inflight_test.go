package sluice

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// inflightBlock is a directive of one count zone (events 1 an hour, a
// penalty of 2h) with settle_wait wait and max_waiting room.
func inflightBlock(zone, wait, room string) string {
	return `rate_limit {
	zone ` + zone + ` {
		key {http.request.header.X-User}
		events 1
		window 1h
		count 401
		penalty 2h
	}
	settle_wait ` + wait + `
	max_waiting ` + room + `
}`
}

// holdCharge sends a request through h whose next handler answers 200 once
// release is closed; it returns once the request is charged (in flight),
// and the request's error on done.
func holdCharge(t *testing.T, h *Handler, user string) (release chan struct{}, done chan error) {
	release, done, running := make(chan struct{}), make(chan error, 1), make(chan struct{})
	go func() {
		_, err := serveWith(h, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			close(running)
			<-release
			w.WriteHeader(http.StatusOK)
			return nil
		}), user)
		done <- err
	}()
	select {
	case <-running:
	case <-time.After(5 * time.Second):
		t.Fatal("the first request never ran")
	}
	return release, done
}

// The bounds of a wait for charges in flight: it ends at settle_wait with
// a refusal that starts no penalty; a waiter whose client leaves returns
// 499 and charges nothing; with the waiting room full, or settle_wait 0,
// the refusal comes at once; and once the charge in flight comes back,
// the next request passes (no penalty started meanwhile).
func TestSettleWaitBounds(t *testing.T) {
	h := newHandler(t, inflightBlock("sw_bounds", "150ms", "10"), nil)
	release, done := holdCharge(t, h, "ann")
	t0 := time.Now()
	if w, err := serveWith(h, okHandler, "ann"); err != nil || w.Code != 429 {
		t.Fatalf("while the charge is in flight: %d %v, want 429 after the wait", w.Code, err)
	} else if ra := w.Header().Get("Retry-After"); ra == "7200" {
		t.Fatalf("refused with Retry-After %s: the penalty started", ra)
	}
	if d := time.Since(t0); d < 150*time.Millisecond {
		t.Fatalf("refused after %v, want a wait of settle_wait (150ms)", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(30*time.Millisecond, cancel)
	_, err := serveCtxWith(ctx, h, okHandler, "ann", "")
	var he caddyhttp.HandlerError
	if !errors.As(err, &he) || he.StatusCode != statusClientClosed || !errors.Is(err, errChargesAbandoned) {
		t.Fatalf("a waiter whose client left: %v, want a 499 error", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if w, _ := serveWith(h, okHandler, "ann"); w.Code != 200 {
		t.Fatalf("after the charge came back: %d, want 200 (no penalty started, nothing charged by the waiters)", w.Code)
	}

	// The room (max_waiting 1) is full: refused at once, not after the
	// settle_wait of 5s.
	full := newHandler(t, inflightBlock("sw_full", "5s", "1"), nil)
	release, done = holdCharge(t, full, "cat")
	waiting := make(chan int)
	go func() {
		w, _ := serveWith(full, okHandler, "cat")
		waiting <- w.Code
	}()
	for full.room.n.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	t0 = time.Now()
	if w, _ := serveWith(full, okHandler, "cat"); w.Code != 429 || time.Since(t0) > 2*time.Second {
		t.Fatalf("the room full: %d after %v, want 429 at once", w.Code, time.Since(t0))
	}
	close(release)
	if code := <-waiting; code != 200 {
		t.Fatalf("the waiter, once the charge came back: %d, want 200", code)
	}
	<-done

	// settle_wait 0: refused at once, though the charge comes back soon.
	off := newHandler(t, inflightBlock("sw_off", "0", "10"), nil)
	release, done = holdCharge(t, off, "bob")
	time.AfterFunc(300*time.Millisecond, func() { close(release) })
	if w, _ := serveWith(off, okHandler, "bob"); w.Code != 429 {
		t.Fatalf("settle_wait 0: %d, want 429 (no waiting)", w.Code)
	}
	<-done
	if w, _ := serveWith(off, okHandler, "bob"); w.Code != 200 {
		t.Fatalf("settle_wait 0, after the charge came back: %d, want 200 (no penalty started)", w.Code)
	}
}

// settle_wait's checks: a duration from 0 to 1m.
func TestSettleWaitConfig(t *testing.T) {
	for _, c := range []struct{ value, want string }{
		{"-1s", "settle_wait must be between 0"},
		{"2m", "settle_wait must be between 0"},
		{"soon", "settle_wait must be a duration"},
	} {
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(inflightBlock("sw_cfg", c.value, "10")))
		if err == nil {
			err = h.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("settle_wait %s: %v, want %q", c.value, err, c.want)
		}
	}
}
