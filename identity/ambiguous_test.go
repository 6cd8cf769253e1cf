package identity

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// deriveFor derives the key of req, with vars as the values of the
// placeholders that are not request fields.
func deriveFor(d *Deriver, req *http.Request, vars mapResolver) (Token, *Ambiguity) {
	tok, _, amb := d.DeriveRequest(vars, req, nil)
	return tok, amb
}

// newReq returns a GET request for target whose header is exactly h: names
// are kept as written, so a test can hold spellings net/http would have
// merged (and the tests below that go through net/http check it merges
// them).
func newReq(target string, h http.Header) *http.Request {
	if target == "" {
		target = "/"
	}
	r := httptest.NewRequest(http.MethodGet, target, nil)
	r.Header = h
	if r.Header == nil {
		r.Header = http.Header{}
	}
	// Headers a browser sends, so that the field lookups have company.
	for k, v := range map[string]string{"User-Agent": "test", "Accept": "*/*", "Accept-Encoding": "gzip", "Accept-Language": "en"} {
		if _, ok := r.Header[k]; !ok {
			r.Header[k] = []string{v}
		}
	}
	return r
}

// keyCase is one request and what its key must be: the key of a request
// carrying the field once with value want, the fallback candidate's key
// (fallback), or ambiguous naming field amb.
type keyCase struct {
	name     string
	target   string
	header   http.Header
	want     string
	fallback bool
	amb      *Ambiguity
}

// checkKeys runs cases against a deriver whose first candidate is the one
// under test and whose second is {fb} ("fallback"); single(v) builds the
// request that carries the field once with value v.
func checkKeys(t *testing.T, d *Deriver, single func(v string) *http.Request, cases []keyCase) {
	t.Helper()
	vars := mapResolver{"fb": "fallback"}
	fallback, _ := deriveFor(d, newReq("/", nil), vars)
	if fallback.Candidate() != 2 {
		t.Fatalf("a request without the field: candidate %d, want the fallback (2)", fallback.Candidate())
	}
	for _, tc := range cases {
		got, amb := deriveFor(d, newReq(tc.target, tc.header), vars)
		switch {
		case tc.amb != nil:
			if amb == nil || *amb != *tc.amb {
				t.Errorf("%s: ambiguity %v (token %s), want %v", tc.name, amb, got, *tc.amb)
			}
		case amb != nil:
			t.Errorf("%s: ambiguous (%v), want a key", tc.name, *amb)
		case tc.fallback:
			if got != fallback {
				t.Errorf("%s: token %s, want the fallback candidate's %s", tc.name, got, fallback)
			}
		default:
			want, wamb := deriveFor(d, single(tc.want), vars)
			if wamb != nil || want.Candidate() != 1 {
				t.Fatalf("%s: the single value %q gives candidate %d (%v)", tc.name, tc.want, want.Candidate(), wamb)
			}
			if got != want {
				t.Errorf("%s: token %s, want %s (the key of the single value %q)", tc.name, got, want, tc.want)
			}
		}
	}
}

// TestHeaderKeyIsUnambiguous: a header read by a key gives its one value,
// whether sent once or repeated identically, under any spelling of its name
// that a backend may read as the same header; different values under any
// of them make the request ambiguous, in whatever order.
func TestHeaderKeyIsUnambiguous(t *testing.T) {
	amb := &Ambiguity{Source: SourceHeader, Name: "X-Login-User"}
	cases := []keyCase{
		{name: "once", header: http.Header{"X-Login-User": {"alice"}}, want: "alice"},
		{name: "twice, identical", header: http.Header{"X-Login-User": {"alice", "alice"}}, want: "alice"},
		{name: "three times, identical", header: http.Header{"X-Login-User": {"alice", "alice", "alice"}}, want: "alice"},
		{name: "alice then another", header: http.Header{"X-Login-User": {"alice", "mallory"}}, amb: amb},
		{name: "another then alice", header: http.Header{"X-Login-User": {"mallory", "alice"}}, amb: amb},
		{name: "alice then empty", header: http.Header{"X-Login-User": {"alice", ""}}, amb: amb},
		{name: "empty then alice", header: http.Header{"X-Login-User": {"", "alice"}}, amb: amb},
		{name: "alice, alice, another", header: http.Header{"X-Login-User": {"alice", "alice", "x"}}, amb: amb},
		{name: "empty", header: http.Header{"X-Login-User": {""}}, fallback: true},
		{name: "empty twice", header: http.Header{"X-Login-User": {"", ""}}, fallback: true},
		{name: "absent", fallback: true},
		// One value holding a comma is one value, as sent.
		{name: "comma inside one value", header: http.Header{"X-Login-User": {"alice, bob"}}, want: "alice, bob"},
		{name: "comma inside one value, repeated", header: http.Header{"X-Login-User": {"alice,bob", "alice,bob"}}, want: "alice,bob"},
		// Names as a handler may have stored them (net/http canonicalises
		// what it reads; see TestHeaderNameSpellingsOverHTTP).
		{name: "lower-case name", header: http.Header{"x-login-user": {"alice"}}, want: "alice"},
		{name: "two name cases, identical", header: http.Header{"X-Login-User": {"alice"}, "x-login-user": {"alice"}}, want: "alice"},
		{name: "two name cases, different", header: http.Header{"X-Login-User": {"alice"}, "x-login-user": {"mallory"}}, amb: amb},
		// CGI and FastCGI name all three HTTP_X_LOGIN_USER (Caddy drops
		// the '_' and '.' spellings unless its servers options keep
		// them).
		{name: "underscores", header: http.Header{"X_login_user": {"alice"}}, want: "alice"},
		{name: "dots", header: http.Header{"X.login.user": {"alice"}}, want: "alice"},
		{name: "hyphens and dots, different", header: http.Header{"X-Login-User": {"alice"}, "X.login.user": {"mallory"}}, amb: amb},
		{name: "underscores and dots, different", header: http.Header{"X_login_user": {"alice"}, "X.Login.User": {"mallory"}}, amb: amb},
		{name: "hyphens and underscores, identical", header: http.Header{"X-Login-User": {"alice"}, "X_login_user": {"alice"}}, want: "alice"},
		{name: "hyphens and underscores, different", header: http.Header{"X-Login-User": {"alice"}, "X_login_user": {"mallory"}}, amb: amb},
		{name: "mixed separators, different", header: http.Header{"X-Login-User": {"alice"}, "X_login-user": {"mallory"}}, amb: amb},
		// Not the same header.
		{name: "longer name", header: http.Header{"X-Login-User": {"alice"}, "X-Login-Users": {"mallory"}}, want: "alice"},
		{name: "other separator", header: http.Header{"X-Login-User": {"alice"}, "X~login~user": {"mallory"}}, want: "alice"},
		{name: "no separator", header: http.Header{"X-Login-User": {"alice"}, "XxLoginxUser": {"mallory"}}, want: "alice"},
	}
	single := func(v string) *http.Request { return newReq("/", http.Header{"X-Login-User": {v}}) }
	checkKeys(t, mustDeriver(t, 32, 64, "{http.request.header.X-Login-User}", "{fb}"), single, cases)
	// The configured spelling of the name does not matter either.
	checkKeys(t, mustDeriver(t, 32, 64, "{http.request.header.x-login-user}", "{fb}"), single,
		[]keyCase{
			{name: "configured lower case", header: http.Header{"X-Login-User": {"alice"}}, want: "alice"},
			{name: "configured lower case, different", header: http.Header{"X-Login-User": {"alice", "bob"}}, amb: &Ambiguity{Source: SourceHeader, Name: "x-login-user"}},
		})
	checkKeys(t, mustDeriver(t, 32, 64, "{http.request.header.X_Login_User}", "{fb}"), single,
		[]keyCase{
			{name: "configured with underscores", header: http.Header{"X-Login-User": {"alice"}}, want: "alice"},
		})
}

// TestCookieKeyIsUnambiguous: the same rule for a cookie, across one or
// several Cookie fields, with names matched ignoring case (as Caddy's
// placeholder matches them).
func TestCookieKeyIsUnambiguous(t *testing.T) {
	amb := &Ambiguity{Source: SourceCookie, Name: "session"}
	cookie := func(lines ...string) http.Header { return http.Header{"Cookie": lines} }
	cases := []keyCase{
		{name: "once", header: cookie("session=abc"), want: "abc"},
		{name: "among others", header: cookie("theme=dark; session=abc;lang=en"), want: "abc"},
		{name: "twice, identical", header: cookie("session=abc; session=abc"), want: "abc"},
		{name: "two fields, identical", header: cookie("session=abc", "x=1; session=abc"), want: "abc"},
		{name: "twice, different", header: cookie("session=abc; session=xyz"), amb: amb},
		{name: "twice, different, reversed", header: cookie("session=xyz; session=abc"), amb: amb},
		{name: "two fields, different", header: cookie("session=abc", "session=xyz"), amb: amb},
		{name: "name case, different", header: cookie("Session=xyz; session=abc"), amb: amb},
		{name: "name case, identical", header: cookie("SESSION=abc; session=abc"), want: "abc"},
		{name: "quoted", header: cookie(`session="abc"`), want: "abc"},
		{name: "quoted and not", header: cookie(`session="abc"; session=abc`), want: "abc"},
		{name: "encoded", header: cookie("session=%61b+c"), want: "ab c"},
		{name: "encoded and not", header: cookie("session=%61bc; session=abc"), want: "abc"},
		{name: "encoded, different", header: cookie("session=%62bc; session=abc"), amb: amb},
		{name: "empty and not", header: cookie("session=; session=abc"), amb: amb},
		{name: "spaces around", header: cookie("  session = abc ;"), want: "abc"},
		{name: "comma inside one value", header: cookie("session=abc, def"), want: "abc, def"},
		{name: "absent", header: cookie("sessionid=abc; xsession=x"), fallback: true},
		{name: "empty", header: cookie("session="), fallback: true},
	}
	single := func(v string) *http.Request { return newReq("/", cookie("session="+v)) }
	checkKeys(t, mustDeriver(t, 32, 64, "{http.request.cookie.session}", "{fb}"), single, cases)
}

// TestQueryKeyIsUnambiguous: the same rule for a query argument: names
// and values compared unescaped, names ignoring case, ';' a separator too.
func TestQueryKeyIsUnambiguous(t *testing.T) {
	amb := &Ambiguity{Source: SourceQuery, Name: "user"}
	cases := []keyCase{
		{name: "once", target: "/?user=alice", want: "alice"},
		{name: "among others", target: "/?a=1&user=alice&b=2", want: "alice"},
		{name: "twice, identical", target: "/?user=alice&user=alice", want: "alice"},
		{name: "twice, identical once unescaped", target: "/?user=al%69ce&user=alice", want: "alice"},
		{name: "twice, different", target: "/?user=alice&user=bob", amb: amb},
		{name: "twice, different, reversed", target: "/?user=bob&user=alice", amb: amb},
		{name: "name case, different", target: "/?user=alice&User=bob", amb: amb},
		{name: "escaped name, different", target: "/?us%65r=bob&user=alice", amb: amb},
		{name: "semicolon, different", target: "/?user=alice;user=bob", amb: amb},
		{name: "no value and a value", target: "/?user&user=alice", amb: amb},
		{name: "plus is a space", target: "/?user=a+b", want: "a b"},
		// One value holding a comma is one value; two values are not it.
		{name: "comma inside one value", target: "/?user=alice%2Cbob", want: "alice,bob"},
		{name: "absent", target: "/?users=alice&xuser=bob", fallback: true},
		{name: "empty", target: "/?user=", fallback: true},
	}
	single := func(v string) *http.Request {
		return newReq("/?user="+strings.NewReplacer("%", "%25", "&", "%26", ";", "%3B", "+", "%2B", " ", "+", ",", "%2C").Replace(v), nil)
	}
	checkKeys(t, mustDeriver(t, 32, 64, "{http.request.uri.query.user}", "{fb}"), single, cases)
}

// TestMultiPartKeyIsUnambiguous: in a template, each request field obeys
// the rule; a template with an empty part is empty whatever an ambiguous
// part holds (the next candidate decides), and a candidate before it that
// is present decides alone.
func TestMultiPartKeyIsUnambiguous(t *testing.T) {
	tenant := &Ambiguity{Source: SourceHeader, Name: "X-Tenant"}
	user := &Ambiguity{Source: SourceHeader, Name: "X-User"}
	cases := []keyCase{
		{name: "once each", header: http.Header{"X-Tenant": {"acme"}, "X-User": {"alice"}}, want: "acme|alice"},
		{name: "tenant repeated identically", header: http.Header{"X-Tenant": {"acme", "acme"}, "X-User": {"alice"}}, want: "acme|alice"},
		{name: "tenant ambiguous", header: http.Header{"X-Tenant": {"acme", "evil"}, "X-User": {"alice"}}, amb: tenant},
		{name: "user ambiguous", header: http.Header{"X-Tenant": {"acme"}, "X-User": {"alice", "bob"}}, amb: user},
		{name: "both ambiguous: the first named", header: http.Header{"X-Tenant": {"a", "b"}, "X-User": {"c", "d"}}, amb: tenant},
		{name: "tenant spelled with underscores, different", header: http.Header{"X-Tenant": {"acme"}, "X_tenant": {"evil"}, "X-User": {"alice"}}, amb: tenant},
		{name: "tenant ambiguous, user absent", header: http.Header{"X-Tenant": {"acme", "evil"}}, fallback: true},
		{name: "user absent", header: http.Header{"X-Tenant": {"acme"}}, fallback: true},
	}
	single := func(v string) *http.Request {
		t, u, _ := strings.Cut(v, "|")
		return newReq("/", http.Header{"X-Tenant": {t}, "X-User": {u}})
	}
	checkKeys(t, mustDeriver(t, 32, 64, "tenant-{http.request.header.X-Tenant}/{http.request.header.X-User}", "{fb}"), single, cases)

	// A present candidate before the ambiguous one decides alone.
	d := mustDeriver(t, 32, 64, "{http.auth.user.id}", "{http.request.header.X-Api-Key}", "{fb}")
	req := newReq("/", http.Header{"X-Api-Key": {"k1", "k2"}})
	byUser, amb := deriveFor(d, req, mapResolver{"http.auth.user.id": "u1", "fb": "fallback"})
	if amb != nil || byUser.Candidate() != 1 {
		t.Errorf("account present: candidate %d, ambiguity %v; want the account's key", byUser.Candidate(), amb)
	}
	if _, amb := deriveFor(d, req, mapResolver{"fb": "fallback"}); amb == nil || amb.Name != "X-Api-Key" {
		t.Errorf("no account, X-Api-Key ambiguous: ambiguity %v, want X-Api-Key", amb)
	}
}

// TestRawAndTokenForFollowTheRule: log_key's raw value and the admin API's
// token for a raw value agree with the key a request with a repeated,
// identical field gets.
func TestRawAndTokenForFollowTheRule(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{http.request.header.X-Api-Key}", "k-{http.request.uri.query.key}")
	req := newReq("/", http.Header{"X-Api-Key": {"sk_1", "sk_1"}})
	tok, _, amb := d.DeriveRequest(mapResolver{}, req, nil)
	if amb != nil {
		t.Fatalf("ambiguous: %v", amb)
	}
	if raw := d.Raw(mapResolver{}, req); raw != "sk_1" {
		t.Errorf("Raw = %q, want sk_1", raw)
	}
	if got, ok := d.TokenFor(0, "sk_1"); !ok || got != tok {
		t.Errorf("TokenFor(0, sk_1) = %s %v, want %s", got, ok, tok)
	}
	req = newReq("/?key=a%2Fb&key=a/b", nil)
	tok, _, amb = d.DeriveRequest(mapResolver{}, req, nil)
	if amb != nil {
		t.Fatalf("ambiguous: %v", amb)
	}
	if raw := d.Raw(mapResolver{}, req); raw != "k-a/b" {
		t.Errorf("Raw = %q, want k-a/b", raw)
	}
	if got, ok := d.TokenFor(1, "k-a/b"); !ok || got != tok {
		t.Errorf("TokenFor(1, k-a/b) = %s %v, want %s", got, ok, tok)
	}
	if raw := d.Raw(mapResolver{}, newReq("/", http.Header{"X-Api-Key": {"sk_1", "sk_2"}})); raw != "" {
		t.Errorf("Raw of an ambiguous key = %q, want empty", raw)
	}
}

// TestHeaderNameSpellingsOverHTTP: what a client can send over HTTP/1.1 and
// HTTP/2 (cleartext) reaches a handler of net/http's server as the rule
// expects: names that differ in case are merged by net/http (so repeating
// a header under another case is a repetition), and a name spelled with
// '_' is accepted and kept apart, then read as the same header.
func TestHeaderNameSpellingsOverHTTP(t *testing.T) {
	d := mustDeriver(t, 32, 64, "{http.request.header.X-Login-User}", "{fb}")
	vars := mapResolver{"fb": "fallback"}
	type seen struct {
		tok Token
		amb *Ambiguity
	}
	got := make(chan seen, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, amb := deriveFor(d, r, vars)
		got <- seen{tok, amb}
	}))
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	alice, _ := deriveFor(d, newReq("/", http.Header{"X-Login-User": {"alice"}}), vars)

	check := func(what string, s seen, wantAmb bool) {
		t.Helper()
		switch {
		case wantAmb && s.amb == nil:
			t.Errorf("%s: token %s, want ambiguous", what, s.tok)
		case !wantAmb && s.amb != nil:
			t.Errorf("%s: ambiguous (%v), want alice's key", what, *s.amb)
		case !wantAmb && s.tok != alice:
			t.Errorf("%s: token %s, want alice's %s", what, s.tok, alice)
		}
	}

	// HTTP/1.1, the header block byte for byte.
	for _, tc := range []struct {
		lines   string
		wantAmb bool
	}{
		{"x-login-user: alice\r\n", false},
		{"X-LOGIN-USER: alice\r\nx-login-user: alice\r\n", false},
		{"x-login-user: alice\r\nX-LOGIN-USER: mallory\r\n", true},
		{"X-LOGIN-USER: mallory\r\nx-login-user: alice\r\n", true},
		{"X_Login_User: alice\r\n", false},
		{"X-Login-User: alice\r\nx_login_user: mallory\r\n", true},
		{"X-Login-User: alice\r\nX.Login.User: mallory\r\n", true},
	} {
		what := "HTTP/1.1 " + strings.ReplaceAll(tc.lines, "\r\n", " | ")
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"+tc.lines+"\r\n")
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v (net/http refused the request)", what, err, resp)
		}
		check(what, <-got, tc.wantAmb)
	}

	// HTTP/2 (h2c): names travel lower case.
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	for _, tc := range []struct {
		header  http.Header
		wantAmb bool
	}{
		{http.Header{"x-login-user": {"alice"}}, false},
		{http.Header{"X-Login-User": {"alice", "alice"}}, false},
		{http.Header{"X-Login-User": {"alice", "mallory"}}, true},
		{http.Header{"X-Login-User": {"alice"}, "x-LOGIN-user": {"mallory"}}, true},
		{http.Header{"X-Login-User": {"alice"}, "x_login_user": {"mallory"}}, true},
	} {
		what := "HTTP/2 " + fmtHeader(tc.header)
		req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = tc.header
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("%s: answered over %s, want HTTP/2", what, resp.Proto)
		}
		check(what, <-got, tc.wantAmb)
	}
}

func fmtHeader(h http.Header) string {
	var b strings.Builder
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k + ": " + v + " | ")
		}
	}
	return b.String()
}

// TestDeriveRequestAllocations: reading a request field allocates nothing,
// sent once or repeated, ambiguous or not, except a query value that holds
// an escape (unescaping it costs one allocation).
func TestDeriveRequestAllocations(t *testing.T) {
	for _, tc := range []struct {
		name, cand, target string
		header             http.Header
		want               float64
	}{
		{"header", "{http.request.header.X-Api-Key}", "/", http.Header{"X-Api-Key": {"sk_live_0123456789abcdef"}}, 0},
		{"header, lower-case name configured", "{http.request.header.x-api-key}", "/", http.Header{"X-Api-Key": {"sk_live_0123456789abcdef"}}, 0},
		{"header, address", "{http.request.header.X-Real-Addr}", "/", http.Header{"X-Real-Addr": {"[2001:db8::1]:443"}}, 0},
		{"header, repeated", "{http.request.header.X-Api-Key}", "/", http.Header{"X-Api-Key": {"k", "k"}, "X_api_key": {"k"}}, 0},
		{"header, ambiguous", "{http.request.header.X-Api-Key}", "/", http.Header{"X-Api-Key": {"k", "j"}}, 0},
		{"cookie", "{http.request.cookie.session}", "/", http.Header{"Cookie": {"theme=dark; session=0123456789abcdef; lang=en"}}, 0},
		{"cookie, ambiguous", "{http.request.cookie.session}", "/", http.Header{"Cookie": {"session=a; session=b"}}, 0},
		{"query", "{http.request.uri.query.key}", "/?a=1&key=0123456789abcdef&b=2", nil, 0},
		{"query, escaped name", "{http.request.uri.query.key}", "/?k%65y=0123456789abcdef", nil, 0},
		{"query, escaped value", "{http.request.uri.query.key}", "/?key=a%2Fb", nil, 1},
		{"template", "tenant-{http.request.header.X-Tenant}/{http.request.cookie.session}", "/", http.Header{"X-Tenant": {"acme"}, "Cookie": {"session=abc"}}, 0},
	} {
		d := mustDeriver(t, 32, 64, tc.cand)
		req := newReq(tc.target, tc.header)
		scratch := make([]byte, 0, 256)
		r := mapResolver{}
		var tok Token
		allocs := testing.AllocsPerRun(1000, func() {
			tok, scratch, _ = d.DeriveRequest(r, req, scratch)
		})
		if allocs != tc.want {
			t.Errorf("%s: %v allocations per call, want %v", tc.name, allocs, tc.want)
		}
		_ = tok
	}
}

// benchRequest is a request as a browser or an API client sends it.
func benchRequest(target string) *http.Request {
	return newReq(target, http.Header{
		"X-Api-Key":       {"sk_live_0123456789abcdef0123456789abcdef"},
		"Cookie":          {"theme=dark; session=0123456789abcdef0123456789abcdef; lang=en"},
		"Content-Type":    {"application/json"},
		"X-Forwarded-For": {"203.0.113.9"},
		"Referer":         {"https://example.com/"},
	})
}

func benchDeriveRequest(b *testing.B, cand, target string) {
	b.ReportAllocs()
	d := mustDeriver(b, 32, 64, cand, "{http.vars.client_ip}")
	req := benchRequest(target)
	r := mapResolver{"http.vars.client_ip": "203.0.113.9"}
	scratch := make([]byte, 0, 256)
	var tok Token
	for b.Loop() {
		tok, scratch, _ = d.DeriveRequest(r, req, scratch)
	}
	if tok.Candidate() != 1 {
		b.Fatalf("candidate %d", tok.Candidate())
	}
}

func BenchmarkDeriveRequestHeader(b *testing.B) {
	benchDeriveRequest(b, "{http.request.header.X-Api-Key}", "/")
}

func BenchmarkDeriveRequestCookie(b *testing.B) {
	benchDeriveRequest(b, "{http.request.cookie.session}", "/")
}

func BenchmarkDeriveRequestQuery(b *testing.B) {
	benchDeriveRequest(b, "{http.request.uri.query.key}", "/?page=2&key=sk_live_0123456789abcdef0123456789abcdef&sort=asc")
}
