package caddytest_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// loadExample loads examples/<name> as written, except that its ports come
// from the environment placeholders it documents (set here to this
// package's ports), Caddy's storage and autosave stay out of the user's
// directories, and each zone name in renames is replaced by a name of this
// run's own (zone names are global and the memory store outlives reloads).
func loadExample(t *testing.T, name string, env map[string]string, renames map[string]string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(raw)
	t.Setenv("SLUICE_ADMIN_PORT", strconv.Itoa(adminPort))
	t.Setenv("SLUICE_PORT", strconv.Itoa(portA))
	for k, v := range env {
		t.Setenv(k, v)
	}
	// The global options block is the first line that is exactly "{".
	const open = "\n{\n"
	if strings.Count(cfg, open) < 1 {
		t.Fatalf("%s: no global options block", name)
	}
	cfg = strings.Replace(cfg, open, open+"\tpersist_config off\n\tstorage file_system "+storageDir+"\n", 1)
	for from, to := range renames {
		decl := "zone " + from + " {"
		if n := strings.Count(cfg, decl); n != 1 {
			t.Fatalf("%s: %q appears %d times, want once", name, decl, n)
		}
		cfg = strings.Replace(cfg, decl, "zone "+to+" {", 1)
	}
	if !strings.Contains(cfg, "admin localhost:{$SLUICE_ADMIN_PORT") {
		// Without it the load would move the admin endpoint away from
		// this package's port.
		t.Fatalf("%s: the admin endpoint is not {$SLUICE_ADMIN_PORT}", name)
	}
	load(t, newTester(t), cfg)
}

// TestExampleLogin loads examples/login.Caddyfile in front of a stand-in
// application that refuses every password (401), and checks what its
// comment promises: one address spraying many accounts is stopped by the
// per-IP zone after 20 attempts; many addresses guessing one account are
// stopped by the per-account zone after 5; neither blocks anyone else, and
// nothing but POST /login is limited.
func TestExampleLogin(t *testing.T) {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/login" {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"invalid credentials"}`))
			return
		}
		_, _ = w.Write([]byte("app"))
	}))
	defer app.Close()
	account, perIP := zoneName("login_account"), zoneName("login_ip")
	loadExample(t, "login.Caddyfile",
		map[string]string{"SLUICE_LOGIN_UPSTREAM": app.Listener.Addr().String()},
		map[string]string{"login_account": account, "login_ip": perIP})

	login := func(c *http.Client, user string) result {
		t.Helper()
		return do(t, c, http.MethodPost, siteA+"/login", "X-Login-User: "+user)
	}
	type outcome struct{ reached, refused int }
	count := func(r result, what string, o *outcome, wantLimit int64, retry [2]int64) {
		t.Helper()
		switch r.code {
		case http.StatusUnauthorized: // the application saw the attempt
			o.reached++
		case http.StatusTooManyRequests:
			o.refused++
			// The refusal is the example's uniform body; the headers tell
			// which zone refused (its capacity and refill interval).
			if want := `{"error":"too many login attempts","retry_after":`; !strings.HasPrefix(r.body, want) {
				t.Errorf("%s: refusal body %q, want it to start with %s", what, r.body, want)
			}
			if got := intHeader(t, r, "X-Ratelimit-Limit"); got != wantLimit {
				t.Errorf("%s: refused with X-RateLimit-Limit %d, want %d (the zone that should refuse)", what, got, wantLimit)
			}
			expectRetryAfter(t, r, retry[0], retry[1], what)
		default:
			t.Errorf("%s: status %d (body %q), want 401 from the application or 429", what, r.code, r.body)
		}
	}

	// Password spraying: one address, 40 accounts, one guess each. The
	// per-IP zone (20, refilling 2 a minute: Retry-After 30s) stops it.
	sprayer := clientFrom(t, "127.0.0.2")
	var spray outcome
	for i := 1; i <= 40; i++ {
		count(login(sprayer, "user"+strconv.Itoa(i)+"-"+nonce), "spray #"+strconv.Itoa(i), &spray, 20, [2]int64{25, 30})
		if i <= 20 && spray.refused > 0 {
			t.Fatalf("spray #%d: refused before the per-IP allowance of 20 was spent", i)
		}
	}
	if spray.reached != 20 || spray.refused != 20 {
		t.Errorf("one address trying 40 accounts: %d attempts reached the application and %d were refused, want exactly 20 and 20", spray.reached, spray.refused)
	}
	// Another address is not blocked by the sprayer's exhaustion.
	var bystander outcome
	count(login(clientFrom(t, "127.0.0.3"), "user1-"+nonce), "another address", &bystander, 0, [2]int64{})
	if bystander.reached != 1 {
		t.Errorf("another address was refused after the sprayer's")
	}

	// Distributed guessing: 30 addresses, one guess each, all against one
	// account. The per-account zone (5, refilling one every 3 minutes:
	// Retry-After 180s) stops it, whatever the address.
	victim := "victim-" + nonce
	var guess outcome
	for i := 1; i <= 30; i++ {
		ip := "127.0.1." + strconv.Itoa(i)
		count(login(clientFrom(t, ip), victim), "guess from "+ip, &guess, 5, [2]int64{170, 180})
		if i <= 5 && guess.refused > 0 {
			t.Fatalf("guess from %s: refused before the per-account allowance of 5 was spent", ip)
		}
	}
	if guess.reached != 5 || guess.refused != 25 {
		t.Errorf("30 addresses guessing one account: %d attempts reached the application and %d were refused, want exactly 5 and 25", guess.reached, guess.refused)
	}
	// The addresses of that run can still log in to other accounts (each
	// spent one of its 20), and the victim's bucket is no one else's.
	var other outcome
	count(login(clientFrom(t, "127.0.1.7"), "someone-else-"+nonce), "another account", &other, 0, [2]int64{})
	if other.reached != 1 {
		t.Errorf("another account from an address of the guessing run was refused")
	}

	// Only POST /login is limited.
	for i := 1; i <= 30; i++ {
		r := expect(t, get(t, sprayer, siteA+"/login"), 200, "GET /login #"+strconv.Itoa(i))
		expectNoLimitHeaders(t, r, "GET /login")
		expect(t, get(t, sprayer, siteA+"/"), 200, "GET / #"+strconv.Itoa(i))
	}
}
