package caddytest_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// Charges in flight: right-password logins of one account, more at once
// than its budget (5), all pass: a request refused only because of charges
// still in flight waits for them, and they come back (200 is not counted).
// (Wrong passwords still reach the application exactly 5 times:
// TestCountConcurrentLoginsMemory.)
func TestCountInFlightWaits(t *testing.T) {
	app := newLoginApp(t, 300*time.Millisecond)
	zone := zoneName("inflight")
	load(t, newTester(t), config("", countLoginSite, "ZONE", zone, "APP", app.Listener.Addr().String()))
	c := loopbackClient(64)

	owner := "owner-" + nonce
	out, _ := burstDo(t, c, http.MethodPost, siteA+"/login", 10, 10, "X-User: "+owner, "X-Password: right")
	if ok, refused := countBurst(t, out, "10 concurrent right-password logins"); ok != 10 || refused != 0 {
		t.Fatalf("10 concurrent right-password logins: %d × 200, %d × 429; want 10 × 200", ok, refused)
	}
	out, _ = burstDo(t, c, http.MethodPost, siteA+"/login", 40, 10, "X-User: "+owner, "X-Password: right")
	if ok, refused := countBurst(t, out, "40 right-password logins 10 at a time"); ok != 40 || refused != 0 {
		t.Fatalf("40 right-password logins 10 at a time: %d × 200, %d × 429; want 40 × 200", ok, refused)
	}
	expectZoneUntouched(t, zone, owner, 5)
}

// The login example: 25 concurrent right-password logins from one address
// for 25 accounts (the per-IP zone allows 20 failures and boxes the
// address for 15 minutes) all pass, and no penalty starts: a fresh
// account's login from that address passes afterwards.
func TestExampleLoginConcurrentRightPasswords(t *testing.T) {
	app := newLoginApp(t, 500*time.Millisecond)
	account, perIP := zoneName("login_account"), zoneName("login_ip")
	loadExample(t, "login.Caddyfile",
		map[string]string{"SLUICE_LOGIN_UPSTREAM": app.Listener.Addr().String()},
		map[string]string{"login_account": account, "login_ip": perIP})
	c := clientFrom(t, "127.0.4.1")
	codes := make([]int, 25)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest(http.MethodPost, siteA+"/login", nil)
			req.Header.Set("X-Login-User", "user"+strconv.Itoa(i)+"-"+nonce)
			req.Header.Set("X-User", "user"+strconv.Itoa(i)+"-"+nonce)
			req.Header.Set("X-Password", "right")
			resp, err := doRetry(t, c, req)
			if err != nil {
				t.Errorf("login %d: %v", i, err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	close(start)
	wg.Wait()
	tl := map[int]int{}
	for _, code := range codes {
		tl[code]++
	}
	if tl[200] != 25 {
		t.Fatalf("25 concurrent right-password logins from one address: %v; want 25 × 200", tl)
	}
	r := do(t, c, http.MethodPost, siteA+"/login", "X-Login-User: fresh-"+nonce, "X-Password: right")
	if r.code != http.StatusOK {
		t.Fatalf("a fresh account's right-password login afterwards: %d (Retry-After %q); want 200 (no penalty)", r.code, r.header.Get("Retry-After"))
	}
	expectZoneUntouched(t, perIP, "127.0.4.1", 20)
}

// Hanging up does not take the charge back: ten guesses whose clients
// leave (0.8 s) before the application answers (1 s). Five reach it and
// keep their charges; the other five wait for those charges and leave too,
// charging nothing. The key is spent: the next request is refused.
func TestCountHangUpKeepsCharge(t *testing.T) {
	app := newLoginApp(t, time.Second)
	zone := zoneName("hangup")
	load(t, newTester(t), config("", countLoginSite, "ZONE", zone, "APP", app.Listener.Addr().String()))
	c := loopbackClient(16)
	user := "hangup-" + nonce
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, 10)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, siteA+"/login", nil)
			req.Header.Set("X-User", user)
			req.Header.Set("X-Password", "wrong")
			resp, err := c.Do(req)
			// A waiter may get its 429 as the first guesses' clients
			// leave a moment before its own (their charges then settle,
			// kept): a refusal, not an answer of the application.
			if err == nil && resp.StatusCode != http.StatusTooManyRequests {
				resp.Body.Close()
				t.Errorf("guess %d: answered %d before the client left", i, resp.StatusCode)
			} else if err == nil {
				resp.Body.Close()
			}
			errs[i] = err
		}()
	}
	close(start)
	wg.Wait()
	// Let Caddy finish the requests the clients left (the application
	// answers after 1 s, and a refund would land then).
	time.Sleep(1500 * time.Millisecond)
	if got := app.saw(user); got != 5 {
		t.Fatalf("the application saw %d guesses, want exactly 5", got)
	}
	code, body := adminAPI(t, http.MethodGet, "/rate_limit/zones/"+zone+"/keys/"+user)
	if code != http.StatusOK || jsonInt(t, body, "remaining") != 0 {
		t.Fatalf("the key after ten guesses that hung up: %d %v; want remaining 0 (five charges kept)", code, body)
	}
	r := do(t, c, http.MethodPost, siteA+"/login", "X-User: "+user, "X-Password: right")
	if r.code != http.StatusTooManyRequests {
		t.Fatalf("the next login: %d, want 429", r.code)
	}
	if got := app.saw(user); got != 5 {
		t.Fatalf("the application saw %d guesses, want exactly 5", got)
	}
}

// A later directive's refusal is not an earlier count zone's response: A
// counts 4xx (3 per 10 m), B allows 1 per 10 m. B's 429s (written, or
// handed to handle_errors) leave A untouched, and so do its 400s for an
// ambiguous key (B keyed on X-Key, sent twice with different values).
func TestCountIgnoresLaterRefusal(t *testing.T) {
	for _, mode := range []string{"body", "handle_errors", "ambiguous"} {
		t.Run(mode, func(t *testing.T) {
			a, b := zoneName("later_a"), zoneName("later_b")
			resp, keyB := "", "X-User"
			switch mode {
			case "handle_errors":
				resp = "\n\t\t\tresponse handle_errors"
			case "ambiguous":
				keyB = "X-Key"
			}
			load(t, newTester(t), config("", `
http://localhost:@A@ {
	route {
		rate_limit {
			zone @ZA@ {
				key {http.request.header.X-User}
				events 3
				window 10m
				count 4xx
			}
		}
		rate_limit {
			zone @ZB@ {
				key {http.request.header.@KEYB@}
				events 1
				window 10m
			}@RESP@
		}
		respond "ok"
	}
	handle_errors 429 {
		respond "refused by B" 429
	}
}`, "ZA", a, "ZB", b, "RESP", resp, "KEYB", keyB))
			c := loopbackClient(2)
			user := "later-" + nonce
			if mode == "ambiguous" {
				for i := range 4 {
					r := sendFields(t, c, http.MethodGet, siteA+"/", "X-User", user, "X-Key", "one", "X-Key", "two")
					expect(t, r, 400, "an ambiguous key #"+strconv.Itoa(i+1))
				}
				expectZoneUntouched(t, a, user, 3)
				return
			}
			expect(t, get(t, c, siteA+"/", "X-User: "+user), 200, "the first request")
			for i := range 5 {
				r := expect(t, get(t, c, siteA+"/", "X-User: "+user), 429, "refused by B #"+strconv.Itoa(i+1))
				if ra := intHeader(t, r, "Retry-After"); ra < 590 {
					t.Fatalf("refusal #%d: Retry-After %d, want B's (about 600 s), not A's", i+1, ra)
				}
			}
			expectZoneUntouched(t, a, user, 3)
		})
	}
}

// A request whose client leaves while a later directive holds it back
// (waiting for charges in flight, or for its turn) never reached the
// application: an earlier count zone gives its charge back, as for that
// directive's refusal. A counts 401 (3 per 10 m); B holds the second
// right-password login of one account while the first is answered (1 s);
// its client leaves at 0.4 s.
func TestCountGivesBackLaterWaitAbandoned(t *testing.T) {
	for name, zoneB := range map[string]string{
		"settle_wait": "count 401\n\t\t\t\twindow 10m\n\t\t\t}\n\t\t\tsettle_wait 5s",
		"delay":       "window 4s\n\t\t\t\tdelay 5s\n\t\t\t}",
	} {
		t.Run(name, func(t *testing.T) {
			app := newLoginApp(t, time.Second)
			a, b := zoneName("abandon_a"), zoneName("abandon_b")
			load(t, newTester(t), config("", `
http://localhost:@A@ {
	route {
		rate_limit {
			zone @ZA@ {
				key {http.request.header.X-User}
				events 3
				window 10m
				count 401
			}
		}
		rate_limit {
			zone @ZB@ {
				key {http.request.header.X-User}
				events 1
				@HOLD@
		}
		reverse_proxy @APP@
	}
}`, "ZA", a, "ZB", b, "HOLD", zoneB, "APP", app.Listener.Addr().String()))
			c := loopbackClient(4)
			user := "abandon-" + nonce
			first := make(chan result, 1)
			go func() { first <- get(t, c, siteA+"/", "X-User: "+user, "X-Password: right") }()
			time.Sleep(200 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, siteA+"/", nil)
			req.Header.Set("X-User", user)
			req.Header.Set("X-Password", "right")
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
				t.Fatalf("the second login: answered %d before its client left", resp.StatusCode)
			}
			expect(t, <-first, 200, "the first login")
			if got := app.saw(user); got != 1 {
				t.Fatalf("the application saw %d logins, want 1 (the second left while held by B)", got)
			}
			expectZoneUntouched(t, a, user, 3)
		})
	}
}

// A reload that changes the Redis store's settings (a new client) while
// count charges are in flight and requests wait for them: the old client
// stays until they have settled, so the charges of the right-password
// logins come back and the waiters get their answer from Redis (on main
// the old client was closed at once: the refunds were lost, leaving the
// key spent, and the waiters failed over).
func TestCountInFlightAcrossRedisStoreChange(t *testing.T) {
	srv := redistest.Start(t)
	app := newLoginApp(t, time.Second)
	tc := newTester(t)
	zone := zoneName("inflight_store")
	site := func(timeout string) string {
		return config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 5
			window 1h
			count 401
			fail closed
		}
		store redis @URL@ {
			timeout @TIMEOUT@
		}
		settle_wait 5s
	}
	reverse_proxy @APP@
}`, "ZONE", zone, "URL", srv.URL(), "TIMEOUT", timeout, "APP", app.Listener.Addr().String())
	}
	load(t, tc, site("2s"))
	c := loopbackClient(16)
	user := "store-" + nonce
	done := make(chan []burstOut, 1)
	go func() {
		out, _ := burstDo(t, c, http.MethodPost, siteA+"/login", 8, 8, "X-User: "+user, "X-Password: right")
		done <- out
	}()
	time.Sleep(300 * time.Millisecond) // five in flight, three waiting
	load(t, tc, site("3s"))
	if ok, refused := countBurst(t, <-done, "8 right-password logins across the reload"); ok != 8 || refused != 0 {
		t.Fatalf("8 right-password logins across a reload that changed the store: %d × 200, %d × 429; want 8 × 200", ok, refused)
	}
	expectZoneUntouched(t, zone, user, 5)
}

// settle_wait in a directive where nothing counts statuses or settles is
// accepted (it is harmless) but warned about at load, once.
func TestSettleWaitWithoutCountWarns(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	load(t, newTester(t), config(logGlobal(logPath, "INFO"), `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 3
			window 1h
		}
		settle_wait 5s
	}
	respond "ok"
}`, "ZONE", zoneName("settle_wait_alone")))
	lines, _ := readLog(t, logPath)
	n := 0
	for _, l := range lines {
		if l.str("logger") == sluiceLogger && l.str("level") == "warn" && strings.Contains(l.str("msg"), "settle_wait is set, but no zone") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d warnings about a settle_wait with nothing to wait for, want 1", n)
	}
}
