package simulate

import (
	"encoding/csv"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// placement puts a traffic key (a CSV's key column, a pattern's clients)
// and cost where the configuration's zones read them:
//
//   - a key that is an IP address is the request's remote address, so
//     {client_ip} and {remote_host} are that address;
//   - any other key goes into every request header, cookie and query
//     argument that a zone's key candidates read, and is the
//     authenticated user ({http.auth.user.id}); the request's remote
//     address is then an address of the key's own (fd00::/8 and 56 bits
//     of the key's hash), so zones keyed on the address see one client
//     per key too;
//   - a cost goes into every request header, cookie and query argument
//     that a zone's cost placeholder reads (a static cost stays as it is).
type placement struct {
	headers, cookies, query             []string
	costHeaders, costCookies, costQuery []string
	// costUsed: some zone reads its cost from the request; costSeen: the
	// traffic gave a cost.
	costUsed, costSeen bool
	// hostDefaulted: a request without a host was given the default one.
	hostDefaulted bool
}

func newPlacement(zones []*ZoneConfig) *placement {
	p := &placement{}
	add := func(dst *[]string, v string) {
		for _, e := range *dst {
			if e == v {
				return
			}
		}
		*dst = append(*dst, v)
	}
	for _, z := range zones {
		for _, ph := range z.placeholders() {
			switch {
			case strings.HasPrefix(ph, "http.request.header."):
				name := strings.TrimPrefix(ph, "http.request.header.")
				if !isClientIPHeader(name) {
					add(&p.headers, http.CanonicalHeaderKey(name))
				}
			case strings.HasPrefix(ph, "http.request.cookie."):
				add(&p.cookies, strings.TrimPrefix(ph, "http.request.cookie."))
			case strings.HasPrefix(ph, "http.request.uri.query."):
				add(&p.query, strings.TrimPrefix(ph, "http.request.uri.query."))
			}
		}
		for _, ph := range z.costPlaceholders() {
			switch {
			case strings.HasPrefix(ph, "http.request.header."):
				add(&p.costHeaders, http.CanonicalHeaderKey(strings.TrimPrefix(ph, "http.request.header.")))
			case strings.HasPrefix(ph, "http.request.cookie."):
				add(&p.costCookies, strings.TrimPrefix(ph, "http.request.cookie."))
			case strings.HasPrefix(ph, "http.request.uri.query."):
				add(&p.costQuery, strings.TrimPrefix(ph, "http.request.uri.query."))
			default:
				continue
			}
			p.costUsed = true
		}
	}
	return p
}

// isClientIPHeader: headers that carry a client address set by proxies.
func isClientIPHeader(name string) bool {
	switch strings.ToLower(name) {
	case "x-forwarded-for", "x-real-ip", "forwarded", "cf-connecting-ip", "true-client-ip",
		"x-client-ip", "fastly-client-ip", "x-cluster-client-ip", "x-original-forwarded-for":
		return true
	}
	return false
}

// apply places key and cost ("" for none) on req.
func (p *placement) apply(req *Request, key, cost string) {
	var q url.Values
	var cookies []string
	if req.Header == nil {
		req.Header = http.Header{}
	}
	if addr, err := netip.ParseAddr(key); err == nil {
		req.RemoteAddr = net.JoinHostPort(addr.String(), "40000")
	} else {
		req.RemoteAddr = net.JoinHostPort(keyAddr(key).String(), "40000")
		if key != "" {
			for _, h := range p.headers {
				req.Header.Set(h, key)
			}
			for _, c := range p.cookies {
				cookies = append(cookies, c+"="+key)
			}
			for _, a := range p.query {
				if q == nil {
					q = url.Values{}
				}
				q.Set(a, key)
			}
			req.UserID = key
		}
	}
	if cost != "" {
		p.costSeen = true
		for _, h := range p.costHeaders {
			req.Header.Set(h, cost)
		}
		for _, c := range p.costCookies {
			cookies = append(cookies, c+"="+cost)
		}
		for _, a := range p.costQuery {
			if q == nil {
				q = url.Values{}
			}
			q.Set(a, cost)
		}
	}
	if len(cookies) > 0 {
		req.Header.Set("Cookie", strings.Join(cookies, "; "))
	}
	if q != nil {
		sep := "?"
		if strings.Contains(req.URI, "?") {
			sep = "&"
		}
		req.URI += sep + q.Encode()
	}
}

// keyAddr is the address of a key that is not one: fd00::/8 (unique local)
// followed by 56 bits of the key's FNV-1a hash, then zeros (a zone masks
// IPv6 keys to /64 by default; the hash sits in the first 64 bits).
func keyAddr(key string) netip.Addr {
	h := fnv.New64a()
	h.Write([]byte(key))
	v := h.Sum64()
	var b [16]byte
	b[0] = 0xfd
	for i := 1; i < 8; i++ {
		b[i] = byte(v >> (8 * (i - 1)))
	}
	return netip.AddrFrom16(b)
}

// csvSource reads a CSV of time,key,path,cost (see docs/simulate.md), one
// row a line: each line, bounded by maxCSVLine, is parsed on its own (a
// quoted field cannot span lines).
type csvSource struct {
	lines   *lineReader
	line    lineFeed
	r       *csv.Reader
	p       *placement
	host    string
	err     error
	counts  SourceCounts
	cols    map[string]int
	started bool
}

var csvColumns = []string{"time", "key", "path", "cost", "method", "host", "settled"}

// lineFeed is the reader of one line for the csv.Reader; at its end the
// csv.Reader sees io.EOF, and reads the next line fed to it.
type lineFeed struct{ b []byte }

func (f *lineFeed) Read(p []byte) (int, error) {
	if len(f.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, f.b)
	f.b = f.b[n:]
	return n, nil
}

func newCSV(r io.Reader, p *placement, host string) *csvSource {
	c := &csvSource{lines: newLineReader(r, maxCSVLine), p: p, host: host, cols: map[string]int{}}
	cr := csv.NewReader(&c.line)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	cr.TrimLeadingSpace = true
	cr.Comment = '#'
	c.r = cr
	for i, col := range csvColumns[:4] {
		c.cols[col] = i
	}
	return c
}

func (c *csvSource) Err() error           { return c.err }
func (c *csvSource) Counts() SourceCounts { return c.counts }

func (c *csvSource) field(rec []string, name string) string {
	i, ok := c.cols[name]
	if !ok || i >= len(rec) {
		return ""
	}
	return strings.TrimSpace(rec[i])
}

func (c *csvSource) Next(req *Request) bool {
	for {
		line, tooLong, err := c.lines.next()
		if err == io.EOF {
			return false
		}
		if err != nil {
			c.err = err
			return false
		}
		c.counts.Lines++
		if tooLong {
			c.counts.Malformed++
			continue
		}
		c.line.b = line
		rec, err := c.r.Read()
		if err == io.EOF {
			continue // an empty line or a comment
		}
		if err != nil {
			c.counts.Malformed++
			continue
		}
		if !c.started {
			c.started = true
			if len(rec) > 0 && strings.EqualFold(strings.TrimSpace(rec[0]), "time") {
				// A header row names the columns (any order; method and
				// host are optional).
				c.cols = map[string]int{}
				for i, name := range rec {
					c.cols[strings.ToLower(strings.TrimSpace(name))] = i
				}
				c.counts.Skipped++
				continue
			}
		}
		t, ok := parseCSVTime(c.field(rec, "time"))
		if !ok {
			c.counts.Malformed++
			continue
		}
		cost := c.field(rec, "cost")
		if cost != "" {
			if n, err := strconv.ParseInt(cost, 10, 64); err != nil || n < 1 {
				c.counts.Malformed++
				continue
			}
		}
		settled, hasSettled := int64(0), false
		if v := c.field(rec, "settled"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || n > algorithms.MaxSettled {
				c.counts.Malformed++
				continue
			}
			settled, hasSettled = n, true
		}
		path := c.field(rec, "path")
		if path == "" {
			path = "/"
		}
		key := c.field(rec, "key")
		if !strings.HasPrefix(path, "/") || len(key) > maxCSVKey {
			c.counts.Malformed++
			continue
		}
		*req = Request{Time: t, Method: c.field(rec, "method"), URI: path, Host: c.field(rec, "host"), Settled: settled, HasSettled: hasSettled}
		if req.Host == "" {
			req.Host = c.host
			c.p.hostDefaulted = true
		}
		c.p.apply(req, key, cost)
		c.counts.Requests++
		return true
	}
}

// parseCSVTime reads a CSV time: RFC 3339 (or another layout parseTS
// knows), or seconds since the Unix epoch, fractions allowed.
func parseCSVTime(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 || f > 1e11 {
			return 0, false
		}
		return int64(f*1000 + 0.5), true
	}
	return parseTimeString(s)
}
