package sluice

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/memstore"
)

// The interactions of concurrency zones (issue 16) with count, penalty and
// delay zones (issues 18 and 17): one post-response step (after.go) gives
// back the count zones' charges and releases the slots, on every exit.

// zoneLimit returns zone name's compiled limit in h.
func zoneLimit(t *testing.T, h *Handler, name string) algorithms.Limit {
	t.Helper()
	for _, z := range h.zones {
		if z.name == name {
			return z.limit
		}
	}
	t.Fatalf("no zone %s", name)
	return algorithms.Limit{}
}

// serveCtxWith sends one request of user through h to next, with ctx.
func serveCtxWith(ctx context.Context, h *Handler, next caddyhttp.Handler, user, status string) (*httptest.ResponseRecorder, error) {
	r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	r.Header.Set("X-User", user)
	if status != "" {
		r.Header.Set("X-Status", status)
	}
	caddyhttp.NewTestReplacer(r)
	w := httptest.NewRecorder()
	return w, h.ServeHTTP(w, r, next)
}

// A request with a count zone and a concurrency zone: both parts of its
// post-response step happen, on every exit path. A status the count zone
// does not count is given back and the slot released; a counted one keeps
// its charge and still releases the slot. While the chain runs, the
// charge is made and the slot held.
func TestCountAndConcurrencyOnEveryExit(t *testing.T) {
	h, st := concHandler(t, `rate_limit {
		zone cc_fails {
			key {http.request.header.X-User}
			events 100
			window 1h
			count 401 403
		}
		zone cc_slots {
			key {http.request.header.X-User}
			concurrent 1
		}
	}`)
	const user = "erin"
	slotTok, rateTok := keyToken(t, h, "cc_slots", user), keyToken(t, h, "cc_fails", user)
	rate := zoneLimit(t, h, "cc_fails")
	left := func() int64 {
		d, _ := st.Peek("cc_fails", rateTok, rate)
		return d.Remaining
	}
	charged := int64(0) // the count zone's charges kept so far
	// during checks, from inside the chain, that the charge is made and
	// the slot held.
	during := func(what string) {
		if n := st.InUse("cc_slots", slotTok); n != 1 {
			t.Errorf("%s: %d slots in use while the chain runs, want 1", what, n)
		}
		if got := left(); got != 100-charged-1 {
			t.Errorf("%s: %d left while the chain runs, want %d (charged before it runs)", what, got, 100-charged-1)
		}
	}
	after := func(what string, counted bool) {
		t.Helper()
		if counted {
			charged++
		}
		if n := st.InUse("cc_slots", slotTok); n != 0 {
			t.Fatalf("%s: %d slots in use afterwards, want 0 (released)", what, n)
		}
		if got := left(); got != 100-charged {
			t.Fatalf("%s: %d left afterwards, want %d (counted %v)", what, got, 100-charged, counted)
		}
	}
	for _, c := range []struct {
		what    string
		status  string
		counted bool
	}{{"a 200", "200", false}, {"a 401", "401", true}, {"a 500", "500", false}, {"a 403", "403", true}} {
		_, err := serveCtxWith(context.Background(), h, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			during(c.what)
			return statusHandler.ServeHTTP(w, r)
		}), user, c.status)
		if err != nil {
			t.Fatal(err)
		}
		after(c.what, c.counted)
	}
	// An error with a status (basic_auth's 401 counts), and one without
	// (a 500: given back).
	_, err := serveCtxWith(context.Background(), h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		during("a 401 error")
		return caddyhttp.Error(http.StatusUnauthorized, errors.New("no"))
	}), user, "")
	if err == nil {
		t.Fatal("the 401 error was lost")
	}
	after("a 401 error", true)
	boom := errors.New("upstream failed")
	if _, err := serveCtxWith(context.Background(), h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		during("an error")
		return boom
	}), user, ""); !errors.Is(err, boom) {
		t.Fatalf("error: %v", err)
	}
	after("an error", false)
	// A panic (a 500: given back), passed on.
	func() {
		defer func() {
			if p := recover(); p != "later handler" {
				t.Fatalf("recovered %v", p)
			}
		}()
		_, _ = serveCtxWith(context.Background(), h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			during("a panic")
			panic("later handler")
		}), user, "")
	}()
	after("a panic", false)
	// A streamed 401: settled (kept) at its first write, the slot held to
	// its end.
	chunks, streamed := make(chan struct{}), make(chan error)
	go func() {
		_, err := serveCtxWith(context.Background(), h, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(http.StatusUnauthorized)
			for range chunks {
				_, _ = w.Write([]byte("chunk\n"))
				w.(http.Flusher).Flush()
			}
			return nil
		}), user, "")
		streamed <- err
	}()
	chunks <- struct{}{}
	if n := st.InUse("cc_slots", slotTok); n != 1 {
		t.Fatalf("while streaming: %d slots in use, want 1", n)
	}
	if w, _ := serveCtxWith(context.Background(), h, okHandler, user, ""); w.Code != 429 || !strings.Contains(w.Body.String(), `"zone":"cc_slots"`) {
		t.Fatalf("a second request while the first streams: %d %s, want 429 from cc_slots", w.Code, w.Body)
	}
	close(chunks)
	if err := <-streamed; err != nil {
		t.Fatal(err)
	}
	after("a streamed 401", true)
	// The client gone before the status was known: the request was
	// forwarded, its charge stays (issue 23, item 2).
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	_, _ = serveCtxWith(ctx, h, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		during("the client gone")
		<-r.Context().Done()
		return r.Context().Err()
	}), user, "")
	after("the client gone", true)
}

// A directive with a count zone and a delay zone (issues 18 and 17): only
// the count zone is settled by status. (The delay zone's charge is
// refundable too, for a waiter that leaves; settling it by a status set it
// does not have dereferenced nil and panicked before the merge.) Beside a
// concurrency zone, the slot goes back too.
func TestCountBesideDelayAndConcurrency(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone cd_fails {
			key {http.request.header.X-User}
			events 5
			window 1h
			count 401
		}
		zone cd_shaped {
			key {http.request.header.X-User}
			events 10
			window 1s
			burst 5
			delay 5s
		}
		zone cd_slots {
			key {http.request.header.X-User}
			concurrent 2
		}
	}`, clock)
	st := h.store.(*memstore.Store)
	const user = "frank"
	failsTok, shapedTok, slotTok := keyToken(t, h, "cd_fails", user), keyToken(t, h, "cd_shaped", user), keyToken(t, h, "cd_slots", user)
	for i, status := range []string{"200", "401", "200"} {
		w, err := serveCtxWith(context.Background(), h, statusHandler, user, status)
		if err != nil || w.Code != 200 && w.Code != 401 {
			t.Fatalf("request %d: %d %v", i, w.Code, err)
		}
	}
	if d, _ := st.Peek("cd_fails", failsTok, zoneLimit(t, h, "cd_fails")); d.Remaining != 4 {
		t.Errorf("cd_fails: %d left, want 4 (one 401 counted, two 200s given back)", d.Remaining)
	}
	if d, _ := st.Peek("cd_shaped", shapedTok, zoneLimit(t, h, "cd_shaped")); d.Remaining != 2 {
		t.Errorf("cd_shaped: %d left, want 2 (every request charged, none given back: the clock stands still)", d.Remaining)
	}
	if n := st.InUse("cd_slots", slotTok); n != 0 {
		t.Errorf("cd_slots: %d in use, want 0", n)
	}
}

// A delay zone beside a concurrency zone: the slot is taken at admission,
// and an admission that waits is admitted, so a waiting request holds its
// slot; a request over the slots is refused (by the concurrency zone, and
// charged nothing in the delay zone) even when the delay zone would let it
// wait. A waiter whose client leaves gives back its slot and its
// reservation, exactly.
func TestDelayBesideConcurrency(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone dc_shaped {
			key {http.request.header.X-User}
			events 1
			window 10s
			burst 1
			delay 1m
		}
		zone dc_slots {
			key {http.request.header.X-User}
			concurrent 2
		}
	}`, clock)
	st := h.store.(*memstore.Store)
	const user = "grace"
	shapedTok, slotTok := keyToken(t, h, "dc_shaped", user), keyToken(t, h, "dc_slots", user)
	shaped := zoneLimit(t, h, "dc_shaped")
	owed := func() time.Duration { // the time until the shaped key is full again
		d, _ := st.Peek("dc_shaped", shapedTok, shaped)
		return d.ResetAfter
	}
	inUse := func() int { return st.InUse("dc_slots", slotTok) }

	// The first request passes at once (the burst) and runs until released.
	hold, release, firstDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := serveCtxWith(context.Background(), h, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			close(hold)
			<-release
			w.WriteHeader(200)
			return nil
		}), user, "")
		firstDone <- err
	}()
	<-hold
	// The second is admitted to wait 10 s for its turn: it holds a slot
	// while it waits.
	ctx, cancel := context.WithCancel(context.Background())
	secondDone := make(chan error, 1)
	go func() {
		_, err := serveCtxWith(ctx, h, okHandler, user, "")
		secondDone <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for h.room.n.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if h.room.n.Load() != 1 {
		t.Fatal("the second request does not wait")
	}
	if n := inUse(); n != 2 {
		t.Fatalf("%d slots in use with one running and one waiting, want 2 (a waiter holds its slot)", n)
	}
	if d := owed(); d != 20*time.Second {
		t.Fatalf("the shaped key is full again in %v, want 20s (a charge and a reservation)", d)
	}
	// The third: the delay zone would let it wait 20 s, but the slots are
	// taken: refused by dc_slots, and nothing reserved.
	w, err := serveCtxWith(context.Background(), h, okHandler, user, "")
	if err != nil || w.Code != 429 || !strings.Contains(w.Body.String(), `"zone":"dc_slots"`) {
		t.Fatalf("third: %d %v %s; want 429 from dc_slots", w.Code, err, w.Body)
	}
	if d := owed(); d != 20*time.Second {
		t.Fatalf("after a refusal by the slots, the shaped key is full again in %v, want 20s (nothing reserved)", d)
	}
	// The waiter's client leaves: a 499, its slot and its reservation back.
	cancel()
	select {
	case err := <-secondDone:
		var he caddyhttp.HandlerError
		if !errors.As(err, &he) || he.StatusCode != 499 {
			t.Fatalf("the departed waiter: %v, want a 499 error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter kept waiting after its client left")
	}
	if n := inUse(); n != 1 {
		t.Fatalf("%d slots in use after the waiter left, want 1 (the running request's)", n)
	}
	if d := owed(); d != 10*time.Second {
		t.Fatalf("after the waiter left, the shaped key is full again in %v, want 10s (its reservation given back)", d)
	}
	if h.room.n.Load() != 0 {
		t.Fatal("the waiter's place in the waiting room was not freed")
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if n := inUse(); n != 0 {
		t.Fatalf("%d slots in use at the end, want 0", n)
	}
}

// A waiter that gets its turn holds its slot from admission to the end of
// its response.
func TestDelayWaiterHoldsItsSlot(t *testing.T) {
	clock := &fakeClock{ms: 1_800_000_000_000}
	h := newHandler(t, `rate_limit {
		zone dw_shaped {
			key {http.request.header.X-User}
			events 10
			window 1s
			burst 1
			delay 5s
		}
		zone dw_slots {
			key {http.request.header.X-User}
			concurrent 1
		}
	}`, clock)
	st := h.store.(*memstore.Store)
	const user = "heidi"
	slotTok := keyToken(t, h, "dw_slots", user)
	if w, err := serveCtxWith(context.Background(), h, okHandler, user, ""); err != nil || w.Code != 200 {
		t.Fatalf("first: %d %v", w.Code, err)
	}
	// The second waits 100 ms for its turn (the clock stands still: the
	// bucket is still empty), holding the one slot.
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		w, _ := serveCtxWith(context.Background(), h, okHandler, user, "")
		done <- w
	}()
	deadline := time.Now().Add(5 * time.Second)
	for h.room.n.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := st.InUse("dw_slots", slotTok); n != 1 {
		t.Fatalf("%d slots in use while a request waits its turn, want 1", n)
	}
	if w, _ := serveCtxWith(context.Background(), h, okHandler, user, ""); w.Code != 429 || !strings.Contains(w.Body.String(), `"zone":"dw_slots"`) {
		t.Fatalf("a third request while the second waits: %d %s, want 429 from dw_slots", w.Code, w.Body)
	}
	if w := <-done; w.Code != 200 {
		t.Fatalf("the waiter: %d, want 200 after its wait", w.Code)
	}
	if n := st.InUse("dw_slots", slotTok); n != 0 {
		t.Fatalf("%d slots in use after the waiter's response, want 0", n)
	}
}

// fail local: a request decided by the fail-local memory store gives its
// slots back there and its count zones' charges there, on every exit.
func TestFailLocalCountAndConcurrency(t *testing.T) {
	h := newHandler(t, `rate_limit {
		zone fl_fails {
			key {http.request.header.X-User}
			events 3
			window 1h
			count 401
			fail local
		}
		zone fl_slots {
			key {http.request.header.X-User}
			concurrent 1
			fail local
		}
	}`, nil)
	local := memstore.New(memstore.Config{SweepInterval: -1})
	t.Cleanup(local.Close)
	useStores(h, failingStore{}, local)
	const user = "ivan"
	slotTok, failsTok := keyToken(t, h, "fl_slots", user), keyToken(t, h, "fl_fails", user)
	fails := zoneLimit(t, h, "fl_fails")
	for i, status := range []string{"200", "401", "500", "401"} {
		w, err := serveCtxWith(context.Background(), h, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			if n := local.InUse("fl_slots", slotTok); n != 1 {
				t.Errorf("request %d: %d slots in use in the local store while it runs, want 1", i, n)
			}
			return statusHandler.ServeHTTP(w, r)
		}), user, status)
		if err != nil || w.Header().Get("X-Ratelimit-Limit") == "" {
			t.Fatalf("request %d: %d %v %v: want decided locally", i, w.Code, err, w.Header())
		}
		if n := local.InUse("fl_slots", slotTok); n != 0 {
			t.Fatalf("request %d: %d slots in use in the local store afterwards, want 0", i, n)
		}
	}
	if d, _ := local.Peek("fl_fails", failsTok, fails); d.Remaining != 1 {
		t.Fatalf("fl_fails: %d left in the local store, want 1 (two 401s counted, the rest given back)", d.Remaining)
	}
	// A panic, decided locally: the slot comes back there.
	func() {
		defer func() { _ = recover() }()
		_, _ = serveCtxWith(context.Background(), h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			panic("later handler")
		}), user, "")
	}()
	if n := local.InUse("fl_slots", slotTok); n != 0 {
		t.Fatalf("after a panic: %d slots in use in the local store, want 0", n)
	}
	if d, _ := local.Peek("fl_fails", failsTok, fails); d.Remaining != 1 {
		t.Fatalf("after a panic: fl_fails %d left, want 1 (its 500 given back)", d.Remaining)
	}
}

// A concurrency zone takes none of count, penalty, delay or delay_after;
// on_exceed pass is allowed (a soft limit on requests in flight).
func TestConcurrencyZoneSettings(t *testing.T) {
	for _, c := range []struct{ sub, want string }{
		{"count 401", "count does not apply to a concurrency zone"},
		{"penalty 1m", "penalty does not apply to a concurrency zone"},
		{"delay 1s", "delay does not apply to a concurrency zone"},
		{"delay_after 1", "delay does not apply to a concurrency zone"},
	} {
		h := new(Handler)
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("rate_limit {\n\tzone cs {\n\t\tconcurrent 2\n\t\t" + c.sub + "\n\t}\n}"))
		if err == nil {
			err = h.Provision(caddyContext(t))
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.sub, err, c.want)
		}
	}
	h, st := concHandler(t, `rate_limit {
		zone cs_soft {
			key {http.request.header.X-User}
			concurrent 1
			on_exceed pass
		}
	}`)
	hold, release, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		_, _ = serveWith(h, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
			close(hold)
			<-release
			return nil
		}), "judy")
	}()
	<-hold
	var marked any
	w, _ := serveWith(h, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		marked, _ = r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer).Get("http.rate_limit.exceeded")
		w.WriteHeader(200)
		return nil
	}), "judy")
	if w.Code != 200 || marked != true {
		t.Fatalf("over the slots with on_exceed pass: %d, exceeded %v; want 200, marked", w.Code, marked)
	}
	close(release)
	<-ended
	if n := st.InUse("cs_soft", keyToken(t, h, "cs_soft", "judy")); n != 0 {
		t.Fatalf("%d slots in use, want 0 (the passed request took none)", n)
	}
}
