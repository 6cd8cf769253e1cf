package caddytest_test

// Identity end to end (issue 5): who the client is, through a real Caddy.
// No request header buys a fresh bucket unless a trusted proxy vouched for
// it; IPs are canonicalised and masked to their prefix; non-IP keys reach
// neither the store (memory or Redis) nor the logs in clear, stay bounded
// and never merge; requests with no key share one bucket, with a warning at
// load time.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
	"github.com/sluicehq/caddy-sluice/memstore"
)

// clientFrom returns an HTTP client whose connections to the loopback sites
// come from the loopback address ip (any of 127.0.0.0/8 on Linux), so a
// test can be several TCP peers at once.
func clientFrom(t *testing.T, ip string) *http.Client {
	t.Helper()
	local := net.ParseIP(ip)
	if local == nil || !local.IsLoopback() {
		t.Fatalf("clientFrom(%q): not a loopback address", ip)
	}
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: local}}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			return d.DialContext(ctx, "tcp4", net.JoinHostPort("127.0.0.1", port))
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// tally counts the outcomes of a series of requests; any status but 200 and
// 429 fails the test.
type tally struct{ pass, refused int }

func (c *tally) add(t *testing.T, r result, what string) {
	t.Helper()
	switch r.code {
	case http.StatusOK:
		c.pass++
	case http.StatusTooManyRequests:
		c.refused++
	default:
		t.Errorf("%s: status %d, want 200 or 429 (body %q)", what, r.code, r.body)
	}
}

// step is one request of a scripted sequence against one bucket.
type step struct {
	path      string
	hdr       string // one "Name: value" header, or ""
	code      int
	remaining int64 // checked on 200s
	body      string
}

// run sends the steps in order; limit is the zone's capacity.
func run(t *testing.T, c *http.Client, limit int64, steps []step) {
	t.Helper()
	for i, s := range steps {
		what := fmt.Sprintf("step %d: %s %q", i+1, s.path, s.hdr)
		var hdrs []string
		if s.hdr != "" {
			hdrs = append(hdrs, s.hdr)
		}
		r := expect(t, get(t, c, siteA+s.path, hdrs...), s.code, what)
		if r.code == http.StatusOK {
			expectLimitHeaders(t, r, limit, s.remaining, what)
			if s.body != "" && r.body != s.body {
				t.Errorf("%s: body %q, want %q", what, r.body, s.body)
			}
		}
	}
}

// randomIP returns a random IPv4 or IPv6 address as text.
func randomIP(rng *rand.Rand) string {
	if rng.IntN(2) == 0 {
		return fmt.Sprintf("%d.%d.%d.%d", 1+rng.IntN(223), rng.IntN(256), rng.IntN(256), 1+rng.IntN(254))
	}
	return fmt.Sprintf("2001:db8:%x:%x::%x", rng.IntN(0x10000), rng.IntN(0x10000), 1+rng.IntN(0xffff))
}

// forwardedFor renders one address as a Forwarded "for=" node.
func forwardedFor(ip string) string {
	if strings.Contains(ip, ":") {
		return `for="[` + ip + `]:4711"`
	}
	return "for=" + ip
}

// spoofHeaders returns a fresh set of client-written forwarding headers.
func spoofHeaders(rng *rand.Rand) []string {
	hops := make([]string, 1+rng.IntN(3))
	for i := range hops {
		hops[i] = randomIP(rng)
	}
	return []string{
		"X-Forwarded-For: " + strings.Join(hops, ", "),
		"X-Real-IP: " + randomIP(rng),
		"Forwarded: " + forwardedFor(randomIP(rng)) + ";proto=https",
		"True-Client-IP: " + randomIP(rng),
		"CF-Connecting-IP: " + randomIP(rng),
	}
}

// TestSpoofedForwardingHeadersBuyNoBucket: with no trusted proxies,
// {client_ip} is the TCP peer. 100 requests from one client, each with a
// fresh random X-Forwarded-For, X-Real-IP and Forwarded (and the CDN
// headers), against 10 per hour: exactly 10 pass.
func TestSpoofedForwardingHeadersBuyNoBucket(t *testing.T) {
	tc := newTester(t)
	z := zoneName("spoof")
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 10
			window 1h
		}
	}
	respond "{client_ip}"
}
`, "ZONE", z))

	c := clientFrom(t, "127.0.0.1")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	var n tally
	for i := 1; i <= 100; i++ {
		r := get(t, c, siteA+"/", spoofHeaders(rng)...)
		n.add(t, r, "request "+strconv.Itoa(i))
		if r.code == http.StatusOK && r.body != "127.0.0.1" {
			t.Errorf("request %d: {client_ip} is %q, want the TCP peer 127.0.0.1", i, r.body)
		}
		if r.code == http.StatusTooManyRequests && i <= 10 {
			t.Errorf("request %d refused before the bucket of 10 was spent", i)
		}
	}
	if n.pass != 10 || n.refused != 90 {
		t.Errorf("100 requests with spoofed forwarding headers: %d passed and %d refused, want exactly 10 and 90", n.pass, n.refused)
	}
}

// trustedLB is the server options of Caddy behind one load balancer on
// loopback that appends the client's address to X-Forwarded-For.
const trustedLB = `	servers {
		trusted_proxies static 127.0.0.1/8
		trusted_proxies_strict
		client_ip_headers X-Forwarded-For
	}`

// TestTrustedProxiesStrict: behind a trusted proxy in strict mode, the key is
// the rightmost X-Forwarded-For address that is not trusted. Requests whose
// rightmost untrusted hop differs get different buckets; requests that share
// it share one, whatever the spoofed entries to its left say.
func TestTrustedProxiesStrict(t *testing.T) {
	tc := newTester(t)
	z := zoneName("strict")
	load(t, tc, config(trustedLB, `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 3
			window 1h
		}
	}
	respond "{client_ip}"
}
`, "ZONE", z))
	lb := clientFrom(t, "127.0.0.1") // the load balancer: a trusted peer
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 6))

	// Client A (198.51.100.10) writes any X-Forwarded-For it likes; the
	// load balancer appends the address it saw. 20 attempts, each with
	// fresh spoofed entries on the left: exactly 3 pass.
	const clientA, clientB = "198.51.100.10", "198.51.100.11"
	var n tally
	for i := 1; i <= 20; i++ {
		spoof := randomIP(rng) + ", " + randomIP(rng)
		r := get(t, lb, siteA+"/", "X-Forwarded-For: "+spoof+", "+clientA)
		n.add(t, r, "client A #"+strconv.Itoa(i))
		if r.code == http.StatusOK && r.body != clientA {
			t.Errorf("client A #%d: {client_ip} %q, want %s", i, r.body, clientA)
		}
	}
	if n.pass != 3 || n.refused != 17 {
		t.Errorf("client A with spoofed leftmost hops: %d passed and %d refused, want exactly 3 and 17", n.pass, n.refused)
	}

	// The same rightmost untrusted hop in other shapes is the same bucket;
	// a leftmost entry naming an unused address buys nothing.
	for _, xff := range []string{
		"198.51.100.99, " + clientA,         // a fresh address, spoofed on the left
		clientA + ", 127.0.0.2",             // a second trusted proxy after the client
		"203.0.113.1, " + clientA + ":5555", // a port kept by a proxy
		clientA,
	} {
		expect(t, get(t, lb, siteA+"/", "X-Forwarded-For: "+xff), 429, "client A as "+xff)
	}

	// Client B, another rightmost untrusted hop, has a bucket of its own.
	run(t, lb, 3, []step{
		{path: "/", hdr: "X-Forwarded-For: " + randomIP(rng) + ", " + clientB, code: 200, remaining: 2, body: clientB},
		{path: "/", hdr: "X-Forwarded-For: " + clientB, code: 200, remaining: 1, body: clientB},
		{path: "/", hdr: "X-Forwarded-For: " + clientA + ", " + clientB, code: 200, remaining: 0, body: clientB},
		{path: "/", hdr: "X-Forwarded-For: " + clientB, code: 429},
	})

	// Without X-Forwarded-For, or with only trusted hops in it, the client is
	// the peer itself: a third bucket.
	run(t, lb, 3, []step{
		{path: "/", code: 200, remaining: 2, body: "127.0.0.1"},
		{path: "/", hdr: "X-Forwarded-For: 127.0.0.5, 127.0.0.6", code: 200, remaining: 1, body: "127.0.0.1"},
	})
}

// TestUntrustedPeerCannotVouch: with trusted_proxies naming only the load
// balancer (127.0.0.1/32), a client connecting from elsewhere (127.0.0.2)
// is keyed on its own address whatever X-Forwarded-For it sends.
func TestUntrustedPeerCannotVouch(t *testing.T) {
	tc := newTester(t)
	z := zoneName("untrusted_peer")
	load(t, tc, config(`	servers {
		trusted_proxies static 127.0.0.1/32
		trusted_proxies_strict
		client_ip_headers X-Forwarded-For
	}`, `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 5
			window 1h
		}
	}
	respond "{client_ip}"
}
`, "ZONE", z))
	direct := clientFrom(t, "127.0.0.2")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	var n tally
	for i := 1; i <= 30; i++ {
		r := get(t, direct, siteA+"/", spoofHeaders(rng)...)
		n.add(t, r, "direct #"+strconv.Itoa(i))
		if r.code == http.StatusOK && r.body != "127.0.0.2" {
			t.Errorf("direct #%d: {client_ip} %q, want the untrusted peer 127.0.0.2", i, r.body)
		}
	}
	if n.pass != 5 || n.refused != 25 {
		t.Errorf("untrusted peer with spoofed headers: %d passed and %d refused, want exactly 5 and 25", n.pass, n.refused)
	}
	// The trusted load balancer still vouches for its clients.
	r := expect(t, get(t, clientFrom(t, "127.0.0.1"), siteA+"/", "X-Forwarded-For: 192.0.2.44"), 200, "via the load balancer")
	if r.body != "192.0.2.44" {
		t.Errorf("via the load balancer: {client_ip} %q, want 192.0.2.44", r.body)
	}
}

// TestTrustedProxiesWithoutStrictTrustsLeftmost documents why the README
// asks for trusted_proxies_strict: without it Caddy takes the LEFTMOST
// X-Forwarded-For address, which the client writes, so behind a proxy that
// appends to the header each spoofed value is a fresh bucket. (This is
// Caddy's behaviour, asserted so the README's advice stays true.)
func TestTrustedProxiesWithoutStrictTrustsLeftmost(t *testing.T) {
	tc := newTester(t)
	z := zoneName("not_strict")
	load(t, tc, config(`	servers {
		trusted_proxies static 127.0.0.1/8
		client_ip_headers X-Forwarded-For
	}`, `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {client_ip}
			events 1
			window 1h
		}
	}
	respond "{client_ip}"
}
`, "ZONE", z))
	lb := clientFrom(t, "127.0.0.1")
	for i := 1; i <= 5; i++ {
		spoof := "192.0.2." + strconv.Itoa(100+i)
		r := expect(t, get(t, lb, siteA+"/", "X-Forwarded-For: "+spoof+", 198.51.100.10"), 200, "non-strict #"+strconv.Itoa(i))
		if r.body != spoof {
			t.Errorf("non-strict #%d: {client_ip} %q, want the spoofed leftmost %s", i, r.body, spoof)
		}
	}
}

// TestIPv6PrefixesOverHTTP: a zone keyed on a header that carries an address
// (the test server listens on IPv4 loopback only) and a {client_ip} zone fed
// IPv6 hops through a trusted proxy. Addresses in one /64 share a bucket,
// different /64s do not; ipv6_prefix 48 widens it; IPv4-mapped IPv6 and
// plain IPv4 share one; "[2001:db8::1]:443" is "2001:db8::1".
func TestIPv6PrefixesOverHTTP(t *testing.T) {
	tc := newTester(t)
	z64, z48, z128, zxff := zoneName("v6_64"), zoneName("v6_48"), zoneName("v6_128"), zoneName("v6_xff")
	load(t, tc, config(trustedLB, `
http://localhost:@A@ {
	rate_limit {
		zone @Z64@ {
			match {
				path /64
			}
			key {http.request.header.X-Test-Addr}
			events 2
			window 1h
		}
		zone @Z48@ {
			match {
				path /48
			}
			key {http.request.header.X-Test-Addr}
			events 2
			window 1h
			ipv6_prefix 48
		}
		zone @Z128@ {
			match {
				path /128
			}
			key {http.request.header.X-Test-Addr}
			events 1
			window 1h
			ipv6_prefix 128
		}
		zone @ZXFF@ {
			match {
				path /xff
			}
			key {client_ip}
			events 2
			window 1h
		}
	}
	respond "{client_ip}"
}
`, "Z64", z64, "Z48", z48, "Z128", z128, "ZXFF", zxff))
	c := clientFrom(t, "127.0.0.1")
	addr := func(a string) string { return "X-Test-Addr: " + a }
	xff := func(a string) string { return "X-Forwarded-For: " + a }

	t.Run("/64", func(t *testing.T) {
		run(t, c, 2, []step{
			{path: "/64", hdr: addr("2001:db8:1:1::1"), code: 200, remaining: 1},
			{path: "/64", hdr: addr("2001:db8:1:1:ffff:ffff:ffff:ffff"), code: 200, remaining: 0},
			{path: "/64", hdr: addr("2001:db8:1:1::2"), code: 429},
			{path: "/64", hdr: addr("[2001:db8:1:1::3]:443"), code: 429},
			{path: "/64", hdr: addr("2001:DB8:1:1:0:0:0:4"), code: 429},
			// The neighbouring /64 is another client.
			{path: "/64", hdr: addr("2001:db8:1:2::1"), code: 200, remaining: 1},
			{path: "/64", hdr: addr("2001:db8:1:2:8000::1"), code: 200, remaining: 0},
			{path: "/64", hdr: addr("2001:db8:1:2::1"), code: 429},
			// A zone index is dropped: fe80::1%eth0 and fe80::2%eth1 share fe80::/64.
			{path: "/64", hdr: addr("fe80::1%eth0"), code: 200, remaining: 1},
			{path: "/64", hdr: addr("fe80::2%eth1"), code: 200, remaining: 0},
			{path: "/64", hdr: addr("fe80::3"), code: 429},
		})
	})
	t.Run("IPv4-mapped", func(t *testing.T) {
		run(t, c, 2, []step{
			{path: "/64", hdr: addr("192.0.2.1"), code: 200, remaining: 1},
			{path: "/64", hdr: addr("::ffff:192.0.2.1"), code: 200, remaining: 0},
			{path: "/64", hdr: addr("[::ffff:192.0.2.1]:80"), code: 429},
			{path: "/64", hdr: addr("192.0.2.1:8080"), code: 429},
			// IPv4 stays /32: the next address is another client.
			{path: "/64", hdr: addr("::ffff:192.0.2.2"), code: 200, remaining: 1},
			{path: "/64", hdr: addr("192.0.2.2"), code: 200, remaining: 0},
		})
	})
	t.Run("ipv6_prefix 48", func(t *testing.T) {
		run(t, c, 2, []step{
			{path: "/48", hdr: addr("2001:db8:aa:1::1"), code: 200, remaining: 1},
			{path: "/48", hdr: addr("2001:db8:aa:ffff::1"), code: 200, remaining: 0}, // another /64, same /48
			{path: "/48", hdr: addr("2001:db8:aa:2::5"), code: 429},
			{path: "/48", hdr: addr("2001:db8:ab::1"), code: 200, remaining: 1}, // the next /48
		})
	})
	t.Run("brackets and port", func(t *testing.T) {
		run(t, c, 1, []step{
			{path: "/128", hdr: addr("2001:db8::1"), code: 200, remaining: 0},
			{path: "/128", hdr: addr("[2001:db8::1]:443"), code: 429},
			{path: "/128", hdr: addr("[2001:db8::1]"), code: 429},
			{path: "/128", hdr: addr("2001:0db8:0000:0000:0000:0000:0000:0001"), code: 429},
			// At /128, the next address is another client.
			{path: "/128", hdr: addr("[2001:db8::2]:443"), code: 200, remaining: 0},
			{path: "/128", hdr: addr("2001:db8::2"), code: 429},
		})
	})
	t.Run("client_ip through a trusted proxy", func(t *testing.T) {
		run(t, c, 2, []step{
			{path: "/xff", hdr: xff("2001:db8:77:1::1"), code: 200, remaining: 1, body: "2001:db8:77:1::1"},
			{path: "/xff", hdr: xff("2001:db8:99::1, 2001:db8:77:1::abcd"), code: 200, remaining: 0, body: "2001:db8:77:1::abcd"},
			{path: "/xff", hdr: xff("2001:db8:77:1::9"), code: 429},
			{path: "/xff", hdr: xff("[2001:db8:77:1::9]:443"), code: 429},
			{path: "/xff", hdr: xff("2001:db8:77:2::1"), code: 200, remaining: 1},
			{path: "/xff", hdr: xff("::ffff:203.0.113.7"), code: 200, remaining: 1},
			{path: "/xff", hdr: xff("203.0.113.7"), code: 200, remaining: 0, body: "203.0.113.7"},
			{path: "/xff", hdr: xff("[::ffff:203.0.113.7]:80"), code: 429},
		})
	})
}

// apiKeys are credential-like values of various lengths (some fit inside a
// stored key's 16 payload bytes, so "not contained" is a real check).
var apiKeys = []string{
	"sk_live_51HxQjKLm8q2Zt9Wv4",
	"tok-7f3a9c",
	"alice-key",
	"0123456789abcdef", // 16 hex digits: the size of a hash payload
}

// hostileKeys are key values a client can send in an HTTP header that could
// break a naive key scheme: huge, near-duplicates, the store key's own
// separators and hash-tag braces, percent-encoded and escaped NULs, a tab,
// bytes that are not UTF-8.
func hostileKeys() []string {
	big := strings.Repeat("A", 10<<10)
	return []string{
		big,
		big[:len(big)-1] + "B", // differs only in the last byte
		big + "A",              // one byte longer
		"{", "}", "{}", "}{", "{a}", ":", "::x", "a:b", "a:b:",
		"zone:{h1-00}",
		"sluice:v1:other:{h1-0123456789abcdef0123456789abcdef}",
		"%00", "%00%00", "\\x00", "%7B%7D",
		"a\tb",
		"\xff\xfe\xfd", "caf\xe9", "café",
		"-", "h1-", "e0-",
	}
}

// keyDeriver derives tokens exactly as a zone keyed on
// {http.request.header.X-Api-Key} {client_ip} does.
func keyDeriver(t *testing.T) *identity.Deriver {
	t.Helper()
	var cs []identity.Candidate
	for _, s := range []string{"{http.request.header.X-Api-Key}", "{http.vars.client_ip}"} {
		c, err := identity.Compile(s)
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	d, err := identity.NewDeriver(cs, 32, 64)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type mapResolver map[string]any

func (m mapResolver) Get(k string) (any, bool) { v, ok := m[k]; return v, ok }

// spendEachOnce sends, for every value, two requests with X-Api-Key set to
// it against a zone of 1 event: the first must pass (no value merges with
// an earlier one) and the second be refused (the same value is the same
// bucket). It returns the tokens the values must have.
func spendEachOnce(t *testing.T, c *http.Client, values []string) map[identity.Token]string {
	t.Helper()
	d := keyDeriver(t)
	want := map[identity.Token]string{}
	for i, v := range values {
		what := fmt.Sprintf("value %d (%q, %d bytes)", i, short(v), len(v))
		expect(t, getRaw(t, c, siteA+"/", "X-Api-Key", v), 200, what+" #1: a fresh bucket")
		expect(t, getRaw(t, c, siteA+"/", "X-Api-Key", v), 429, what+" #2: the same bucket")
		tok, _ := d.Derive(mapResolver{"http.request.header.X-Api-Key": v}, nil)
		if tok.Kind() != identity.KindHash {
			t.Fatalf("%s: derives a %q token, want a hash", what, tok.Kind())
		}
		if prev, dup := want[tok]; dup {
			t.Fatalf("%q and %q derive the same token", short(prev), short(v))
		}
		want[tok] = v
	}
	return want
}

// getRaw sends GET with one header whose value is sent byte for byte.
func getRaw(t *testing.T, c *http.Client, url, name, value string) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header[name] = []string{value}
	resp, err := doRetry(t, c, req)
	if err != nil {
		t.Fatalf("GET %s with %s %q: %v", url, name, short(value), err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return result{code: resp.StatusCode, header: resp.Header, body: b.String()}
}

func short(s string) string {
	if len(s) > 24 {
		return s[:24] + fmt.Sprintf("...(%d bytes)", len(s))
	}
	return s
}

// containsRaw reports whether a stored key holds a raw value of at least 4
// bytes (shorter ones may occur by chance inside a hash).
func containsRaw(stored []byte, raw string) bool {
	return len(raw) >= 4 && bytes.Contains(stored, []byte(raw))
}

// TestMemoryStoreNeverSeesRawKeys: requests keyed on an API key header
// through the in-process Caddy leave, in the memory store, one hashed key
// per value and none holding the value; hostile values get distinct,
// bounded keys and never merge.
func TestMemoryStoreNeverSeesRawKeys(t *testing.T) {
	tc := newTester(t)
	z := zoneName("mem_private")
	// A memory store configuration of this test's own, so the shared pooled
	// store it reaches below holds only what this test put in it.
	const maxKeys = 777_001
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 1
			window 1h
		}
		store memory {
			max_keys @MAX@
		}
	}
	respond "ok"
}
`, "ZONE", z, "MAX", strconv.Itoa(maxKeys)))

	c := clientFrom(t, "127.0.0.1")
	values := append(slices.Clone(apiKeys), hostileKeys()...)
	want := spendEachOnce(t, c, values)

	// The handler's store is the pooled store of its configuration: a
	// memory store module with the same configuration attaches to it.
	m := &memstore.Memory{MaxKeys: maxKeys}
	if err := m.Provision(caddy.ActiveContext()); err != nil {
		t.Fatalf("provisioning a memory store to inspect the pooled one: %v", err)
	}
	defer m.Cleanup()
	got := map[identity.Token]bool{}
	m.Store().Keys(func(zone string, key algorithms.Key) {
		if zone != z {
			t.Errorf("the test's store holds a key of zone %q", zone)
			return
		}
		tok := identity.Token(key)
		got[tok] = true
		if tok.Kind() != identity.KindHash {
			t.Errorf("stored key %s: kind %q, want a hash", tok, tok.Kind())
		}
		for _, raw := range values {
			if containsRaw(key[:], raw) || containsRaw([]byte(tok.String()), raw) {
				t.Errorf("stored key %s holds the raw value %q", tok, short(raw))
			}
		}
	})
	if len(got) != len(want) {
		t.Errorf("the store holds %d keys of zone %s, want %d (one per value)", len(got), z, len(want))
	}
	for tok, v := range want {
		if !got[tok] {
			t.Errorf("value %q: its token %s is not in the store", short(v), tok)
		}
	}
}

// TestRedisStoreNeverSeesRawKeys: the same through Caddy with `store redis`
// on a real Redis: SCAN finds one key per value, each
// `sluice:v1:<zone>:{<token>}` with a token of [0-9a-z-] only, none holding
// a raw value, none longer than the schema allows.
func TestRedisStoreNeverSeesRawKeys(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	z := zoneName("redis_private")
	load(t, tc, config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 1
			window 1h
			fail closed
		}
		store redis @URL@ {
			timeout 2s
		}
	}
	respond "ok"
}
`, "ZONE", z, "URL", srv.URL()))

	c := clientFrom(t, "127.0.0.1")
	values := append(slices.Clone(apiKeys), hostileKeys()...)
	want := spendEachOnce(t, c, values)

	schema := regexp.MustCompile(`^sluice:v1:` + regexp.QuoteMeta(z) + `:\{[0-9a-z-]+\}$`)
	maxLen := len("sluice:v1:") + len(z) + len(":{}") + 2 + 3 + 2*16 // kind, candidate, '-', 16 bytes in hex
	wantKeys := map[string]string{}
	for tok, v := range want {
		wantKeys["sluice:v1:"+z+":{"+tok.String()+"}"] = v
	}
	keys := scanRedis(t, srv)
	for _, k := range keys {
		if !schema.MatchString(k) {
			t.Errorf("Redis key %q does not match %s", short(k), schema)
		}
		if len(k) > maxLen {
			t.Errorf("Redis key %q is %d bytes, more than %d", short(k), len(k), maxLen)
		}
		for _, raw := range values {
			if containsRaw([]byte(k), raw) {
				t.Errorf("Redis key %q holds the raw value %q", k, short(raw))
			}
		}
		if _, ok := wantKeys[k]; !ok {
			t.Errorf("unexpected Redis key %q", k)
		}
	}
	if len(keys) != len(wantKeys) {
		t.Errorf("Redis holds %d keys, want %d (one per value)", len(keys), len(wantKeys))
	}
	for k, v := range wantKeys {
		if !slices.Contains(keys, k) {
			t.Errorf("value %q: key %s missing from Redis", short(v), k)
		}
	}
}

// scanRedis lists every key of a standalone server (SCAN, not KEYS), but
// the store's control keys (<prefix>ctl:{sluice…}:…, which every store with
// a deny cache keeps: see redisstore's watch.go).
func scanRedis(t *testing.T, srv *redistest.Server) []string {
	t.Helper()
	var keys []string
	cursor := "0"
	for {
		v := srv.Do(t, "SCAN", cursor, "COUNT", 1000)
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			t.Fatalf("SCAN reply %#v", v)
		}
		cursor = fmt.Sprint(a[0])
		for _, k := range a[1].([]any) {
			if k := fmt.Sprint(k); !strings.Contains(k, "ctl:{sluice") {
				keys = append(keys, k)
			}
		}
		if cursor == "0" {
			return keys
		}
	}
}

// logGlobal is a global `log` option writing Caddy's log as JSON to path.
func logGlobal(path, level string) string {
	return "\tlog {\n\t\toutput file " + path + "\n\t\tformat json\n\t\tlevel " + level + "\n\t}"
}

// logLine is one JSON line of Caddy's log.
type logLine map[string]any

func (l logLine) str(k string) string { s, _ := l[k].(string); return s }

// readLog parses a JSON log file.
func readLog(t *testing.T, path string) ([]logLine, string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading Caddy's log: %v", err)
	}
	var out []logLine
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("Caddy's log line %q is not JSON: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out, string(raw)
}

const sluiceLogger = "http.handlers.rate_limit"

// TestEmptyKeySharedBucketAndWarnings: with `key
// {http.request.header.X-Api-Key}` alone, every request without the header
// (or with it empty) counts against one shared bucket of the zone: exactly
// `events` anonymous requests pass, whoever sends them. At load time Caddy's
// log carries the warning for that zone, and for keys on {remote_host} and
// on a raw X-Forwarded-For; a {client_ip} zone gets none.
func TestEmptyKeySharedBucketAndWarnings(t *testing.T) {
	tc := newTester(t)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	anon, remote, rawXFF, good := zoneName("anon"), zoneName("remote_host"), zoneName("raw_xff"), zoneName("good_key")
	load(t, tc, config(logGlobal(logPath, "INFO"), `
http://localhost:@A@ {
	rate_limit {
		zone @ANON@ {
			key {http.request.header.X-Api-Key}
			events 3
			window 1h
		}
	}
	respond "ok"
}

http://localhost:@B@ {
	rate_limit {
		zone @REMOTE@ {
			match {
				path /remote
			}
			key {remote_host}
			events 1
			window 1h
		}
		zone @RAWXFF@ {
			match {
				path /xff
			}
			key {http.request.header.X-Forwarded-For} {client_ip}
			events 1
			window 1h
		}
		zone @GOOD@ {
			match {
				path /good
			}
			key {http.request.header.X-Api-Key} {client_ip}
			events 1
			window 1h
		}
	}
	respond "ok"
}
`, "ANON", anon, "REMOTE", remote, "RAWXFF", rawXFF, "GOOD", good))

	// Anonymous requests from three different peers, with or without an
	// empty header: one shared bucket of 3.
	peers := []*http.Client{clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.0.2"), clientFrom(t, "127.0.0.3")}
	var n tally
	for i := 0; i < 30; i++ {
		var r result
		if i%2 == 0 {
			r = get(t, peers[i%3], siteA+"/")
		} else {
			r = getRaw(t, peers[i%3], siteA+"/", "X-Api-Key", "")
		}
		n.add(t, r, "anonymous #"+strconv.Itoa(i+1))
		if r.code == http.StatusOK {
			expectLimitHeaders(t, r, 3, int64(3-n.pass), "anonymous #"+strconv.Itoa(i+1))
		}
	}
	if n.pass != 3 || n.refused != 27 {
		t.Errorf("30 anonymous requests: %d passed and %d refused, want exactly 3 and 27 (one shared bucket)", n.pass, n.refused)
	}
	// A request with a key has its own bucket.
	r := expect(t, get(t, peers[0], siteA+"/", "X-Api-Key: k-"+nonce), 200, "with a key")
	expectLimitHeaders(t, r, 3, 2, "with a key")

	lines, _ := readLog(t, logPath)
	warnings := map[string][]string{}
	for _, l := range lines {
		if l.str("logger") == sluiceLogger && l.str("level") == "warn" {
			warnings[l.str("zone")] = append(warnings[l.str("zone")], l.str("msg"))
		}
	}
	expectWarning := func(zone string, parts ...string) {
		t.Helper()
		for _, w := range warnings[zone] {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(w, p)
			}
			if ok {
				return
			}
		}
		t.Errorf("zone %s: no load-time warning mentioning %q; its warnings: %q", zone, parts, warnings[zone])
	}
	expectWarning(anon, "no key candidate is always present", "share one bucket")
	expectWarning(remote, "{http.request.remote.host}", "trusted_proxies")
	expectWarning(rawXFF, "X-Forwarded-For", "fresh bucket", "{client_ip}")
	if len(warnings[good]) != 0 {
		t.Errorf("zone %s (key ... {client_ip}): unexpected warnings %q", good, warnings[good])
	}
	if len(warnings[rawXFF]) != 1 {
		t.Errorf("zone %s: warnings %q, want exactly the forwarding header one ({client_ip} is always present)", rawXFF, warnings[rawXFF])
	}
	if t.Failed() {
		t.Logf("rate_limit log lines: %v", warnings)
	}
}

// TestRefusalLogHidesKeyUnlessLogKey: the refusal log line carries the key's
// token, never the raw API key; with log_key it adds the raw value
// (deliberately), and only for that directive.
func TestRefusalLogHidesKeyUnlessLogKey(t *testing.T) {
	tc := newTester(t)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	hidden, shown := zoneName("log_hidden"), zoneName("log_shown")
	load(t, tc, config(logGlobal(logPath, "DEBUG"), `
http://localhost:@A@ {
	rate_limit {
		zone @HIDDEN@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 1
			window 1h
		}
	}
	respond "ok"
}

http://localhost:@B@ {
	rate_limit {
		zone @SHOWN@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 1
			window 1h
		}
		log_key
	}
	respond "ok"
}
`, "HIDDEN", hidden, "SHOWN", shown))

	secretA, secretB := "sk_hidden_"+nonce, "sk_shown_"+nonce
	c := clientFrom(t, "127.0.0.1")
	expect(t, get(t, c, siteA+"/", "X-Api-Key: "+secretA), 200, "A #1")
	expect(t, get(t, c, siteA+"/", "X-Api-Key: "+secretA), 429, "A #2")
	expect(t, get(t, c, siteB+"/", "X-Api-Key: "+secretB), 200, "B #1")
	expect(t, get(t, c, siteB+"/", "X-Api-Key: "+secretB), 429, "B #2")

	d := keyDeriver(t)
	tokA, _ := d.Derive(mapResolver{"http.request.header.X-Api-Key": secretA}, nil)
	tokB, _ := d.Derive(mapResolver{"http.request.header.X-Api-Key": secretB}, nil)

	lines, raw := readLog(t, logPath)
	if strings.Contains(raw, secretA) {
		t.Errorf("Caddy's log contains the raw key %q of a zone without log_key", secretA)
	}
	found := map[string]logLine{}
	for _, l := range lines {
		if l.str("logger") == sluiceLogger && l.str("msg") == "rate limit exceeded" {
			found[l.str("zone")] = l
		}
	}
	if l, ok := found[hidden]; !ok {
		t.Errorf("no refusal log line for zone %s", hidden)
	} else {
		if l.str("key") != tokA.String() {
			t.Errorf("zone %s: logged key %q, want the token %s", hidden, l.str("key"), tokA)
		}
		if _, ok := l["raw_key"]; ok {
			t.Errorf("zone %s (no log_key): the line has raw_key %q", hidden, l.str("raw_key"))
		}
	}
	if l, ok := found[shown]; !ok {
		t.Errorf("no refusal log line for zone %s", shown)
	} else {
		if l.str("key") != tokB.String() {
			t.Errorf("zone %s: logged key %q, want the token %s", shown, l.str("key"), tokB)
		}
		if l.str("raw_key") != secretB {
			t.Errorf("zone %s (log_key): raw_key %q, want %q", shown, l.str("raw_key"), secretB)
		}
	}
}
