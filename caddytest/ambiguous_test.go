package caddytest_test

// Repeated key fields through a real Caddy (issue 13, item 1): Caddy's
// {http.request.header.X} joins a repeated header with ",", so a second,
// random X-Login-User once bought a fresh bucket per request while the
// backend, reading the first value, saw the victim's account. A key field
// carried with different values now gets 400 and charges nothing.

import (
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// sendFields sends method url through c with the header fields given as
// name and value pairs, each sent as written (name spelling, order of the
// values of one name kept), and returns the answer.
func sendFields(t *testing.T, c *http.Client, method, url string, fields ...string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(fields); i += 2 {
		req.Header[fields[i]] = append(req.Header[fields[i]], fields[i+1])
	}
	resp, err := doRetry(t, c, req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return result{code: resp.StatusCode, header: resp.Header, body: string(b)}
}

// randomValue returns a value no other request of the run sends.
func randomValue(rng *rand.Rand) string {
	return "r" + strconv.FormatUint(rng.Uint64(), 36)
}

// TestExampleLoginRepeatedAccountHeader: examples/login.Caddyfile in front
// of an application that reads the account as Go's Header.Get does (the
// first value). 30 guesses for one account, each with a second, random
// X-Login-User, and 30 with the random one first, all get 400 and none
// reaches the application; the account then still has exactly the
// example's 5 attempts; the address that sent the 60 was charged nothing.
func TestExampleLoginRepeatedAccountHeader(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{} // attempts the application saw, per account
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/login" {
			mu.Lock()
			seen[r.Header.Get("X-Login-User")]++
			mu.Unlock()
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("app"))
	}))
	defer app.Close()
	attempts := func(account string) int {
		mu.Lock()
		defer mu.Unlock()
		return seen[account]
	}
	account, perIP := zoneName("login_account"), zoneName("login_ip")
	loadExample(t, "login.Caddyfile",
		map[string]string{"SLUICE_LOGIN_UPSTREAM": app.Listener.Addr().String()},
		map[string]string{"login_account": account, "login_ip": perIP})

	victim := "alice-" + nonce
	rng := rand.New(rand.NewPCG(1, 2))
	attacker := clientFrom(t, "127.0.3.1")
	codes := map[int]int{}
	for i := 0; i < 60; i++ {
		values := []string{victim, randomValue(rng)}
		if i >= 30 {
			values[0], values[1] = values[1], values[0] // the random one first
		}
		r := sendFields(t, attacker, http.MethodPost, siteA+"/login", "X-Login-User", values[0], "X-Login-User", values[1])
		codes[r.code]++
		if r.code == http.StatusBadRequest {
			expectNoLimitHeaders(t, r, "guess with a repeated X-Login-User")
			if strings.Contains(r.body, victim) {
				t.Errorf("the 400's body %q holds the header's value", r.body)
			}
		}
	}
	if codes[http.StatusBadRequest] != 60 || len(codes) != 1 {
		t.Errorf("60 guesses with a repeated X-Login-User (30 victim first, 30 victim second): statuses %v, want exactly 60 × 400", codes)
	}
	if n := attempts(victim); n != 0 {
		t.Errorf("the application saw %d attempts for the victim, want 0", n)
	}
	if got := scrapeDecisions(t, account); got["ambiguous_key"] != 60 || got["allowed"] != 0 || got["refused"] != 0 {
		t.Errorf("login_account decisions %v, want exactly 60 ambiguous_key and nothing else", got)
	}

	// The account's budget is intact: 30 addresses, one plain guess each
	// (the header sent twice, identically, from every other one): exactly
	// the example's 5 reach the application.
	codes = map[int]int{}
	for i := 1; i <= 30; i++ {
		fields := []string{"X-Login-User", victim}
		if i%2 == 0 {
			fields = append(fields, "X-Login-User", victim)
		}
		codes[sendFields(t, clientFrom(t, "127.0.4."+strconv.Itoa(i)), http.MethodPost, siteA+"/login", fields...).code]++
	}
	if codes[http.StatusUnauthorized] != 5 || codes[http.StatusTooManyRequests] != 25 {
		t.Errorf("30 plain guesses for the victim: statuses %v, want exactly 5 × 401 and 25 × 429", codes)
	}
	if n := attempts(victim); n != 5 {
		t.Errorf("the application saw %d attempts for the victim in all, want exactly 5", n)
	}

	// The attacker's address was charged nothing by its 60 refused
	// guesses: its full 20 of login_ip remain.
	codes = map[int]int{}
	for i := 1; i <= 21; i++ {
		codes[sendFields(t, attacker, http.MethodPost, siteA+"/login", "X-Login-User", "user"+strconv.Itoa(i)+"-"+nonce).code]++
	}
	if codes[http.StatusUnauthorized] != 20 || codes[http.StatusTooManyRequests] != 1 {
		t.Errorf("the attacker's address, 21 accounts: statuses %v, want exactly 20 × 401 and 1 × 429", codes)
	}
}

// TestExhaustedAPIKeyRepeatedHeader: a zone keyed on
// {http.request.header.X-Api-Key} {client_ip}, the key exhausted: 40
// requests that repeat X-Api-Key (a random value after the key or before
// it, the key twice, a random value under a lower-case spelling of the
// name, or under an underscore spelling, over HTTP/1.1 and HTTP/2) are all
// refused, 400 or 429, and none reaches the backend. Caddy itself drops a
// header whose name holds '_' (the request then carries the key alone:
// 429); with the servers options that keep X_Api_Key and X.Api.Key (and
// drop X-Api-Key), those spellings are the key's header, and repeating it
// across them is ambiguous. A 400 goes through the site's handle_errors.
func TestExhaustedAPIKeyRepeatedHeader(t *testing.T) {
	var mu sync.Mutex
	reached := 0
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		reached++
		mu.Unlock()
		_, _ = w.Write([]byte("app"))
	}))
	defer app.Close()
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return reached
	}
	zone := zoneName("api_key")
	load(t, newTester(t), config(`	servers {
		protocols h1 h2c
	}`, `http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 3
			window 1h
		}
	}
	reverse_proxy @APP@
	handle_errors {
		respond "error {err.status_code}" {err.status_code}
	}
}
`, "ZONE", zone, "APP", app.Listener.Addr().String()))

	key := "sk_live_" + nonce
	c := clientFrom(t, "127.0.5.1")
	for i := 1; i <= 3; i++ {
		expect(t, sendFields(t, c, http.MethodGet, siteA+"/", "X-Api-Key", key), 200, "key request "+strconv.Itoa(i))
	}
	expect(t, sendFields(t, c, http.MethodGet, siteA+"/", "X-Api-Key", key), 429, "key request 4: exhausted")
	if n := count(); n != 3 {
		t.Fatalf("the backend saw %d requests, want 3", n)
	}

	h2 := &http.Transport{Protocols: new(http.Protocols)}
	h2.Protocols.SetUnencryptedHTTP2(true)
	defer h2.CloseIdleConnections()
	h2c := &http.Client{Transport: h2}

	rng := rand.New(rand.NewPCG(3, 4))
	variants := []struct {
		name   string
		fields func() []string
		code   int
	}{
		{"key, then a random value", func() []string { return []string{"X-Api-Key", key, "X-Api-Key", randomValue(rng)} }, 400},
		{"a random value, then key", func() []string { return []string{"X-Api-Key", randomValue(rng), "X-Api-Key", key} }, 400},
		{"key twice", func() []string { return []string{"X-Api-Key", key, "X-Api-Key", key} }, 429},
		{"key, and a random value under a lower-case name", func() []string { return []string{"X-Api-Key", key, "x-api-key", randomValue(rng)} }, 400},
		// Caddy drops X_Api_Key before any handler: the key alone.
		{"key, and a random value under X_Api_Key", func() []string { return []string{"X-Api-Key", key, "X_Api_Key", randomValue(rng)} }, 429},
		{"a random value under X_API_KEY, key under x-api-key", func() []string { return []string{"X_API_KEY", randomValue(rng), "x-api-key", key} }, 429},
		{"key, and an empty value", func() []string { return []string{"X-Api-Key", key, "X-Api-Key", ""} }, 400},
		{"key with a comma and a random value in one value", func() []string { return []string{"X-Api-Key", key + "," + randomValue(rng)} }, 200},
	}
	want := map[int]int{}
	got := map[int]int{}
	before := count()
	for i := 0; i < 40; i++ {
		v := variants[i%7] // the last variant is a different key, sent below
		client, proto := c, "HTTP/1.1"
		if i%2 == 1 {
			client, proto = h2c, "HTTP/2"
		}
		r := sendFields(t, client, http.MethodGet, siteA+"/", v.fields()...)
		want[v.code]++
		got[r.code]++
		what := proto + " " + v.name
		if r.code != v.code {
			t.Errorf("%s: status %d (body %q), want %d", what, r.code, r.body, v.code)
		}
		if r.code == http.StatusBadRequest {
			expectNoLimitHeaders(t, r, what)
			if r.body != "error 400" {
				t.Errorf("%s: body %q, want handle_errors' %q", what, r.body, "error 400")
			}
		}
	}
	// Variant i%7 of 40: variants 0 to 4 six times, 5 and 6 five times.
	if want[400] != 23 || want[429] != 17 || got[400] != 23 || got[429] != 17 || len(got) != 2 {
		t.Errorf("40 requests repeating an exhausted X-Api-Key: statuses %v, want exactly %v", got, want)
	}
	if n := count() - before; n != 0 {
		t.Errorf("%d of the 40 reached the backend, want 0", n)
	}
	if got := scrapeDecisions(t, zone); got["ambiguous_key"] != 23 || got["refused"] != 18 || got["allowed"] != 3 {
		t.Errorf("decisions %v, want exactly 3 allowed, 18 refused (the 4th request and 17 of the 40), 23 ambiguous_key", got)
	}

	// With the servers options that keep the '_' and '.' spellings (and
	// drop X-Api-Key), PHP's $_SERVER folds them onto HTTP_X_API_KEY:
	// they are the key's header. The same zone, so the key's bucket is
	// still spent.
	load(t, newTester(t), config(`	servers {
		protocols h1 h2c
		expected_underscore_headers X_Api_Key
		expected_dot_headers X.Api.Key
	}`, `http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 3
			window 1h
		}
	}
	reverse_proxy @APP@
	handle_errors {
		respond "error {err.status_code}" {err.status_code}
	}
}
`, "ZONE", zone, "APP", app.Listener.Addr().String()))
	c = clientFrom(t, "127.0.5.2")
	for _, tc := range []struct {
		name   string
		fields []string
		code   int
	}{
		{"the key under X_Api_Key", []string{"X_Api_Key", key}, 429},
		{"the key under X.Api.Key", []string{"X.Api.Key", key}, 429},
		{"the key under X_Api_Key, a random value under X-Api-Key (dropped by Caddy)", []string{"X_Api_Key", key, "X-Api-Key", randomValue(rng)}, 429},
		{"the key under X_Api_Key, a random value under X.Api.Key", []string{"X_Api_Key", key, "X.Api.Key", randomValue(rng)}, 400},
		{"a random value under X_Api_Key, the key under X.Api.Key", []string{"X_Api_Key", randomValue(rng), "X.Api.Key", key}, 400},
	} {
		r := expect(t, sendFields(t, c, http.MethodGet, siteA+"/", tc.fields...), tc.code, "allowlisted spellings: "+tc.name)
		if r.code == http.StatusBadRequest && r.body != "error 400" {
			t.Errorf("%s: body %q, want handle_errors' %q", tc.name, r.body, "error 400")
		}
	}
	if n := count() - before; n != 0 {
		t.Errorf("allowlisted spellings: %d requests reached the backend, want 0", n)
	}

	// One value holding a comma is one value, as sent: another key, with a
	// bucket of its own.
	v := variants[7]
	expect(t, sendFields(t, c, http.MethodGet, siteA+"/", v.fields()...), v.code, v.name)
	if n := count() - before; n != 1 {
		t.Errorf("the comma-holding key: the backend saw %d requests, want 1", n)
	}
}

// TestCaseNormalisingMap checks the map docs/identity-ambiguous.md
// suggests for an application that reads account names ignoring case:
// the canonical (lower-case) name keys its own bucket, every other
// spelling, and every repeated header (Caddy's map reads the joined
// value, which holds a comma), shares one bucket, and a request without
// the header falls back to the address.
func TestCaseNormalisingMap(t *testing.T) {
	zone := zoneName("login_norm")
	load(t, newTester(t), config("", `http://localhost:@A@ {
	map {http.request.header.X-Login-User} {login_user} {
		~^$                      ""
		~^([a-z0-9._@-]{1,64})$  "${1}"
		default                  "non-canonical"
	}
	rate_limit {
		zone @ZONE@ {
			key {login_user} {client_ip}
			events 2
			window 1h
		}
	}
	respond "ok"
}
`, "ZONE", zone))
	alice := "alice-" + nonce
	c := clientFrom(t, "127.0.6.1")
	for i, tc := range []struct {
		fields []string
		code   int
	}{
		{[]string{"X-Login-User", alice}, 200},
		{[]string{"X-Login-User", alice}, 200},
		{[]string{"X-Login-User", alice}, 429}, // alice's 2 spent
		{[]string{"X-Login-User", strings.ToUpper(alice)}, 200},
		{[]string{"X-Login-User", "Alice-" + nonce}, 200},
		{[]string{"X-Login-User", "aLice-" + nonce}, 429},                      // the non-canonical bucket's 2 spent
		{[]string{"X-Login-User", alice, "X-Login-User", alice}, 429},          // joined "alice,alice": non-canonical
		{[]string{"X-Login-User", "bob-" + nonce, "X-Login-User", alice}, 429}, // joined: non-canonical
		{[]string{"X-Login-User", "bob-" + nonce}, 200},
		{nil, 200}, // the address
		{nil, 200},
		{nil, 429},
	} {
		expect(t, sendFields(t, c, http.MethodGet, siteA+"/", tc.fields...), tc.code, "request "+strconv.Itoa(i+1)+" "+strings.Join(tc.fields, " "))
	}
}
