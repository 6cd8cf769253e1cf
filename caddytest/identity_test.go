package caddytest_test

// Identity end to end (issue 5): who the client is, through a real Caddy.
// No request header buys a fresh bucket unless a trusted proxy vouched for
// it; IPs are canonicalised and masked to their prefix; requests with no
// key share one bucket (TestClientIdentity, one case per rule); non-IP keys
// reach neither the store (memory or Redis) nor the logs in clear, stay
// bounded and never merge (TestStoresNeverSeeRawKeys,
// TestRefusalLogHidesKeyUnlessLogKey); keys that are easy to get wrong
// warn at load time (TestWeakKeysWarnAtLoad).

import (
	"bufio"
	"bytes"
	"cmp"
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

// trustedLB is the server options of Caddy behind one load balancer on
// loopback that appends the client's address to X-Forwarded-For.
const trustedLB = `	servers {
		trusted_proxies static 127.0.0.1/8
		trusted_proxies_strict
		client_ip_headers X-Forwarded-For
	}`

// identitySite is the one site of an identity case: one zone of its own,
// answering with the client's address as Caddy sees it.
const identitySite = `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key @KEY@
			events @EVENTS@
			window 1h
@EXTRA@
		}
	}
	respond "{client_ip}"
}
`

// identityCase is one rule of who the client is: a zone keyed on key,
// events an hour (extra: more of its options), behind the global server
// options servers (trusted proxies), and a script of requests with what
// each must get.
type identityCase struct {
	name    string
	servers string
	key     string
	events  int64
	extra   string
	script  []send
}

// send is one line of a script: n requests alike (1 if n is 0) from the
// loopback address from (127.0.0.1 if empty) with the headers hdrs ("Name:
// value"), plus fresh ones drawn by spoof for each request if it is set.
// Each must get code; on 200s X-RateLimit-Remaining counts down from
// remaining, one per request, and the body ({client_ip}) must be clientIP
// if that is set.
type send struct {
	n         int
	from      string
	hdrs      []string
	spoof     func(*rand.Rand) []string
	code      int
	remaining int64
	clientIP  string
}

// TestClientIdentity: each case loads its zone and runs its script; the
// statuses, the remaining counts and {client_ip} say which requests shared
// a bucket.
func TestClientIdentity(t *testing.T) {
	const clientA, clientB = "198.51.100.10", "198.51.100.11"
	xff := func(v string) []string { return []string{"X-Forwarded-For: " + v} }
	addr := func(v string) []string { return []string{"X-Test-Addr: " + v} }
	// spoofedLeftOf draws an X-Forwarded-For whose rightmost entry is ip
	// (what the load balancer appended) after two the client wrote.
	spoofedLeftOf := func(ip string) func(*rand.Rand) []string {
		return func(rng *rand.Rand) []string { return xff(randomIP(rng) + ", " + randomIP(rng) + ", " + ip) }
	}
	const byAddr = "{http.request.header.X-Test-Addr}"
	emptyKey := []string{"X-Api-Key:"}

	for _, c := range []identityCase{{
		// With no trusted proxies, {client_ip} is the TCP peer: 100
		// requests from one client, each with a fresh random
		// X-Forwarded-For, X-Real-IP and Forwarded (and the CDN headers),
		// against 10 per hour: exactly 10 pass.
		name:   "no trusted proxy: spoofed forwarding headers buy no bucket",
		key:    "{client_ip}",
		events: 10,
		script: []send{
			{n: 10, spoof: spoofHeaders, code: 200, remaining: 9, clientIP: "127.0.0.1"},
			{n: 90, spoof: spoofHeaders, code: 429},
		},
	}, {
		// Behind a trusted proxy in strict mode, the key is the rightmost
		// X-Forwarded-For address that is not trusted: client A writes any
		// X-Forwarded-For it likes, the load balancer appends the address
		// it saw; 20 attempts with fresh spoofed entries: exactly 3 pass.
		name:    "strict: spoofed hops left of the client buy no bucket",
		servers: trustedLB,
		key:     "{client_ip}",
		events:  3,
		script: []send{
			{n: 3, spoof: spoofedLeftOf(clientA), code: 200, remaining: 2, clientIP: clientA},
			{n: 17, spoof: spoofedLeftOf(clientA), code: 429},
		},
	}, {
		// The same rightmost untrusted hop in other shapes is the same
		// bucket; a leftmost entry naming an unused address buys nothing.
		name:    "strict: the client in other shapes is the same bucket",
		servers: trustedLB,
		key:     "{client_ip}",
		events:  3,
		script: []send{
			{n: 3, hdrs: xff(clientA), code: 200, remaining: 2, clientIP: clientA},
			{hdrs: xff("198.51.100.99, " + clientA), code: 429},         // a fresh address, spoofed on the left
			{hdrs: xff(clientA + ", 127.0.0.2"), code: 429},             // a second trusted proxy after the client
			{hdrs: xff("203.0.113.1, " + clientA + ":5555"), code: 429}, // a port kept by a proxy
			{hdrs: xff(clientA), code: 429},
		},
	}, {
		// Client B, another rightmost untrusted hop, has a bucket of its
		// own while client A's is spent.
		name:    "strict: another client behind the proxy has its own bucket",
		servers: trustedLB,
		key:     "{client_ip}",
		events:  3,
		script: []send{
			{n: 3, hdrs: xff(clientA), code: 200, remaining: 2, clientIP: clientA},
			{hdrs: xff(clientA), code: 429},
			{spoof: spoofedLeftOf(clientB), code: 200, remaining: 2, clientIP: clientB},
			{hdrs: xff(clientB), code: 200, remaining: 1, clientIP: clientB},
			{hdrs: xff(clientA + ", " + clientB), code: 200, remaining: 0, clientIP: clientB},
			{hdrs: xff(clientB), code: 429},
		},
	}, {
		// Without X-Forwarded-For, or with only trusted hops in it, the
		// client is the peer itself.
		name:    "strict: without untrusted hops the peer is the client",
		servers: trustedLB,
		key:     "{client_ip}",
		events:  3,
		script: []send{
			{code: 200, remaining: 2, clientIP: "127.0.0.1"},
			{hdrs: xff("127.0.0.5, 127.0.0.6"), code: 200, remaining: 1, clientIP: "127.0.0.1"},
		},
	}, {
		// With trusted_proxies naming only the load balancer
		// (127.0.0.1/32), a client connecting from elsewhere (127.0.0.2) is
		// keyed on its own address whatever forwarding headers it sends;
		// the load balancer still vouches for its clients.
		name: "an untrusted peer cannot vouch",
		servers: `	servers {
		trusted_proxies static 127.0.0.1/32
		trusted_proxies_strict
		client_ip_headers X-Forwarded-For
	}`,
		key:    "{client_ip}",
		events: 5,
		script: []send{
			{n: 5, from: "127.0.0.2", spoof: spoofHeaders, code: 200, remaining: 4, clientIP: "127.0.0.2"},
			{n: 25, from: "127.0.0.2", spoof: spoofHeaders, code: 429},
			{hdrs: xff("192.0.2.44"), code: 200, remaining: 4, clientIP: "192.0.2.44"},
		},
	}, {
		// Why the README asks for trusted_proxies_strict: without it Caddy
		// takes the LEFTMOST X-Forwarded-For address, which the client
		// writes, so behind a proxy that appends to the header each spoofed
		// value is a fresh bucket. (Caddy's behaviour, asserted so the
		// README's advice stays true.)
		name: "not strict: the leftmost, client-written address is the key",
		servers: `	servers {
		trusted_proxies static 127.0.0.1/8
		client_ip_headers X-Forwarded-For
	}`,
		key:    "{client_ip}",
		events: 1,
		script: []send{
			{hdrs: xff("192.0.2.101, 198.51.100.10"), code: 200, remaining: 0, clientIP: "192.0.2.101"},
			{hdrs: xff("192.0.2.102, 198.51.100.10"), code: 200, remaining: 0, clientIP: "192.0.2.102"},
			{hdrs: xff("192.0.2.103, 198.51.100.10"), code: 200, remaining: 0, clientIP: "192.0.2.103"},
			{hdrs: xff("192.0.2.104, 198.51.100.10"), code: 200, remaining: 0, clientIP: "192.0.2.104"},
			{hdrs: xff("192.0.2.105, 198.51.100.10"), code: 200, remaining: 0, clientIP: "192.0.2.105"},
		},
	}, {
		// A key carrying an address (the test server listens on IPv4
		// loopback only, so a header stands in for the peer): addresses in
		// one /64 share a bucket, in any spelling; the neighbouring /64 is
		// another client; a zone index is dropped.
		name:   "IPv6: one 64-bit prefix is one client",
		key:    byAddr,
		events: 2,
		script: []send{
			{hdrs: addr("2001:db8:1:1::1"), code: 200, remaining: 1},
			{hdrs: addr("2001:db8:1:1:ffff:ffff:ffff:ffff"), code: 200, remaining: 0},
			{hdrs: addr("2001:db8:1:1::2"), code: 429},
			{hdrs: addr("[2001:db8:1:1::3]:443"), code: 429},
			{hdrs: addr("2001:DB8:1:1:0:0:0:4"), code: 429},
			{hdrs: addr("2001:db8:1:2::1"), code: 200, remaining: 1},
			{hdrs: addr("2001:db8:1:2:8000::1"), code: 200, remaining: 0},
			{hdrs: addr("2001:db8:1:2::1"), code: 429},
			{hdrs: addr("fe80::1%eth0"), code: 200, remaining: 1}, // fe80::1%eth0 and fe80::2%eth1 share fe80::/64
			{hdrs: addr("fe80::2%eth1"), code: 200, remaining: 0},
			{hdrs: addr("fe80::3"), code: 429},
		},
	}, {
		// IPv4-mapped IPv6 and plain IPv4 are one address; IPv4 stays /32.
		name:   "IPv6: IPv4-mapped is IPv4",
		key:    byAddr,
		events: 2,
		script: []send{
			{hdrs: addr("192.0.2.1"), code: 200, remaining: 1},
			{hdrs: addr("::ffff:192.0.2.1"), code: 200, remaining: 0},
			{hdrs: addr("[::ffff:192.0.2.1]:80"), code: 429},
			{hdrs: addr("192.0.2.1:8080"), code: 429},
			{hdrs: addr("::ffff:192.0.2.2"), code: 200, remaining: 1},
			{hdrs: addr("192.0.2.2"), code: 200, remaining: 0},
		},
	}, {
		name:   "IPv6: ipv6_prefix 48 widens the bucket to 48 bits",
		key:    byAddr,
		events: 2,
		extra:  "ipv6_prefix 48",
		script: []send{
			{hdrs: addr("2001:db8:aa:1::1"), code: 200, remaining: 1},
			{hdrs: addr("2001:db8:aa:ffff::1"), code: 200, remaining: 0}, // another /64, same /48
			{hdrs: addr("2001:db8:aa:2::5"), code: 429},
			{hdrs: addr("2001:db8:ab::1"), code: 200, remaining: 1}, // the next /48
		},
	}, {
		// "[2001:db8::1]:443" is "2001:db8::1"; at /128 the next address
		// is another client.
		name:   "IPv6: brackets, port and spelling are one address at 128 bits",
		key:    byAddr,
		events: 1,
		extra:  "ipv6_prefix 128",
		script: []send{
			{hdrs: addr("2001:db8::1"), code: 200, remaining: 0},
			{hdrs: addr("[2001:db8::1]:443"), code: 429},
			{hdrs: addr("[2001:db8::1]"), code: 429},
			{hdrs: addr("2001:0db8:0000:0000:0000:0000:0000:0001"), code: 429},
			{hdrs: addr("[2001:db8::2]:443"), code: 200, remaining: 0},
			{hdrs: addr("2001:db8::2"), code: 429},
		},
	}, {
		name:    "IPv6: {client_ip} through a trusted proxy is masked to 64 bits",
		servers: trustedLB,
		key:     "{client_ip}",
		events:  2,
		script: []send{
			{hdrs: xff("2001:db8:77:1::1"), code: 200, remaining: 1, clientIP: "2001:db8:77:1::1"},
			{hdrs: xff("2001:db8:99::1, 2001:db8:77:1::abcd"), code: 200, remaining: 0, clientIP: "2001:db8:77:1::abcd"},
			{hdrs: xff("2001:db8:77:1::9"), code: 429},
			{hdrs: xff("[2001:db8:77:1::9]:443"), code: 429},
			{hdrs: xff("2001:db8:77:2::1"), code: 200, remaining: 1},
			{hdrs: xff("::ffff:203.0.113.7"), code: 200, remaining: 1},
			{hdrs: xff("203.0.113.7"), code: 200, remaining: 0, clientIP: "203.0.113.7"},
			{hdrs: xff("[::ffff:203.0.113.7]:80"), code: 429},
		},
	}, {
		// With `key {http.request.header.X-Api-Key}` alone, every request
		// without the header (or with it empty) counts against one shared
		// bucket: exactly `events` anonymous requests pass, whoever sends
		// them; a request with a key has its own bucket.
		name:   "requests without a key share one bucket",
		key:    "{http.request.header.X-Api-Key}",
		events: 3,
		script: []send{
			{from: "127.0.0.1", code: 200, remaining: 2},
			{from: "127.0.0.2", hdrs: emptyKey, code: 200, remaining: 1},
			{from: "127.0.0.3", code: 200, remaining: 0},
			{n: 4, from: "127.0.0.1", code: 429},
			{n: 4, from: "127.0.0.1", hdrs: emptyKey, code: 429},
			{n: 4, from: "127.0.0.2", code: 429},
			{n: 4, from: "127.0.0.2", hdrs: emptyKey, code: 429},
			{n: 4, from: "127.0.0.3", code: 429},
			{n: 4, from: "127.0.0.3", hdrs: emptyKey, code: 429},
			{hdrs: []string{"X-Api-Key: k-" + nonce}, code: 200, remaining: 2},
		},
	}} {
		t.Run(c.name, func(t *testing.T) {
			load(t, newTester(t), config(c.servers, identitySite, "ZONE", zoneName("identity"),
				"KEY", c.key, "EVENTS", strconv.FormatInt(c.events, 10), "EXTRA", c.extra))
			runScript(t, c.events, c.script)
		})
	}
}

// runScript sends a script's requests in order and checks each answer
// against a zone of events.
func runScript(t *testing.T, events int64, script []send) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 5))
	clients := map[string]*http.Client{}
	i := 0
	for _, s := range script {
		from := cmp.Or(s.from, "127.0.0.1")
		if clients[from] == nil {
			clients[from] = clientFrom(t, from)
		}
		for k := range max(s.n, 1) {
			i++
			hdrs := s.hdrs
			if s.spoof != nil {
				hdrs = append(slices.Clone(hdrs), s.spoof(rng)...)
			}
			what := fmt.Sprintf("request %d from %s %q", i, from, hdrs)
			r := expect(t, get(t, clients[from], siteA+"/", hdrs...), s.code, what)
			if r.code != http.StatusOK {
				continue
			}
			expectLimitHeaders(t, r, events, s.remaining-int64(k), what)
			if s.clientIP != "" && r.body != s.clientIP {
				t.Errorf("%s: {client_ip} is %q, want %s", what, r.body, s.clientIP)
			}
		}
	}
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

// storedKey is one key a store holds, as the test inspects it.
type storedKey struct {
	zone  string
	token identity.Token
	raw   [][]byte // its forms as stored or shown (bytes, text)
}

// TestStoresNeverSeeRawKeys: requests keyed on an API key header through
// Caddy leave, in the store, one hashed key per value and none holding the
// value; hostile values get distinct, bounded keys and never merge. For the
// memory store and for `store redis` on a real Redis, where SCAN finds
// keys of the schema `sluice:v1:<zone>:{<token>}`, tokens of [0-9a-z-] only,
// none longer than the schema allows.
func TestStoresNeverSeeRawKeys(t *testing.T) {
	for _, c := range []struct {
		name string
		// start returns the store's Caddyfile block and a function listing
		// what the store holds.
		start func(t *testing.T) (block string, keys func(t *testing.T, zone string) []storedKey)
	}{
		{"memory", func(t *testing.T) (string, func(*testing.T, string) []storedKey) {
			// A memory store configuration of this test's own, so the
			// shared pooled store it reaches holds only what this test put
			// in it: a memory store module with the same configuration
			// attaches to the handler's.
			const maxKeys = 777_001
			return "store memory {\n\t\t\tmax_keys " + strconv.Itoa(maxKeys) + "\n\t\t}", func(t *testing.T, _ string) []storedKey {
				m := &memstore.Memory{MaxKeys: maxKeys}
				if err := m.Provision(caddy.ActiveContext()); err != nil {
					t.Fatalf("provisioning a memory store to inspect the pooled one: %v", err)
				}
				defer m.Cleanup()
				var out []storedKey
				m.Store.Keys(func(zone string, key algorithms.Key) {
					tok := identity.Token(key)
					out = append(out, storedKey{zone, tok, [][]byte{bytes.Clone(key[:]), []byte(tok.String())}})
				})
				return out
			}
		}},
		{"redis", func(t *testing.T) (string, func(*testing.T, string) []storedKey) {
			srv := redistest.Start(t)
			return "store redis " + srv.URL() + " {\n\t\t\ttimeout 2s\n\t\t}", func(t *testing.T, zone string) []storedKey {
				schema := regexp.MustCompile(`^sluice:v1:` + regexp.QuoteMeta(zone) + `:\{([0-9a-z-]+)\}$`)
				maxLen := len("sluice:v1:") + len(zone) + len(":{}") + 2 + 3 + 2*16 // kind, candidate, '-', 16 bytes in hex
				var out []storedKey
				for _, k := range scanRedis(t, srv) {
					if len(k) > maxLen {
						t.Errorf("Redis key %q is %d bytes, more than %d", short(k), len(k), maxLen)
					}
					var tok identity.Token
					m, ok := schema.FindStringSubmatch(k), false
					if m != nil {
						tok, ok = identity.ParseToken(m[1])
					}
					if !ok {
						t.Errorf("Redis key %q does not match %s", short(k), schema)
						continue
					}
					out = append(out, storedKey{zone, tok, [][]byte{[]byte(k)}})
				}
				return out
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			block, keys := c.start(t)
			z := zoneName(c.name + "_private")
			load(t, newTester(t), config("", `
http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-Api-Key} {client_ip}
			events 1
			window 1h
			fail closed
		}
		@STORE@
	}
	respond "ok"
}
`, "ZONE", z, "STORE", block))

			values := append(slices.Clone(apiKeys), hostileKeys()...)
			want := spendEachOnce(t, clientFrom(t, "127.0.0.1"), values)

			got := map[identity.Token]bool{}
			for _, k := range keys(t, z) {
				if k.zone != z {
					t.Errorf("the test's store holds a key of zone %q", k.zone)
					continue
				}
				got[k.token] = true
				if k.token.Kind() != identity.KindHash {
					t.Errorf("stored key %s: kind %q, want a hash", k.token, k.token.Kind())
				}
				for _, raw := range values {
					for _, form := range k.raw {
						if containsRaw(form, raw) {
							t.Errorf("stored key %q holds the raw value %q", short(string(form)), short(raw))
						}
					}
				}
				if _, ok := want[k.token]; !ok {
					t.Errorf("unexpected stored key %s", k.token)
				}
			}
			if len(got) != len(want) {
				t.Errorf("the store holds %d keys of zone %s, want %d (one per value)", len(got), z, len(want))
			}
			for tok, v := range want {
				if !got[tok] {
					t.Errorf("value %q: its token %s is not in the store", short(v), tok)
				}
			}
		})
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

// TestWeakKeysWarnAtLoad: Caddy's log at load time carries a warning for a
// zone whose key can be empty (`key {http.request.header.X-Api-Key}` alone:
// anonymous requests share one bucket, TestClientIdentity), for a key on
// {remote_host} (the TCP peer, and empty on some HTTP/3 0-RTT requests), for
// one on a raw X-Forwarded-For, and for keys on {http.request.remote_ip} or
// {http.request.client_ip}, which are not placeholders (named, with
// {client_ip} suggested); a zone whose last candidate is {client_ip} gets
// none.
func TestWeakKeysWarnAtLoad(t *testing.T) {
	tc := newTester(t)
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	anon, remote, rawXFF, good := zoneName("anon"), zoneName("remote_host"), zoneName("raw_xff"), zoneName("good_key")
	remoteIP, clientIP := zoneName("remote_ip"), zoneName("client_ip")
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
		zone @REMOTEIP@ {
			match {
				path /remote_ip
			}
			key {http.request.remote_ip}
			events 1
			window 1h
		}
		zone @CLIENTIP@ {
			match {
				path /client_ip
			}
			key {http.request.client_ip} {client_ip}
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
`, "ANON", anon, "REMOTE", remote, "RAWXFF", rawXFF, "REMOTEIP", remoteIP, "CLIENTIP", clientIP, "GOOD", good))

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
	expectWarning(remote, "HTTP/3 0-RTT", "{client_ip}")
	expectWarning(remoteIP, "no key candidate is always present", "{http.request.remote_ip} is not a placeholder", "{client_ip}", "{remote_host}")
	expectWarning(clientIP, "{http.request.client_ip} is not a placeholder", "{client_ip}", "{remote_host}")
	if len(warnings[clientIP]) != 1 {
		t.Errorf("zone %s: warnings %q, want exactly the unknown placeholder one ({client_ip} is always present)", clientIP, warnings[clientIP])
	}
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
