package sluice

import (
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/identity"
)

// scratch is the per-request working memory of ServeHTTP, pooled so the hot
// path allocates nothing for it.
type scratch struct {
	reqs  []algorithms.Request
	decs  []algorithms.Decision
	zones []*zone
	buf   []byte
}

var scratchPool = sync.Pool{New: func() any {
	return &scratch{
		reqs:  make([]algorithms.Request, 0, 8),
		decs:  make([]algorithms.Decision, 0, 8),
		zones: make([]*zone, 0, 8),
		buf:   make([]byte, 0, 256),
	}
}}

func (s *scratch) release() {
	s.reqs, s.decs, s.zones = s.reqs[:0], s.decs[:0], s.zones[:0]
	if cap(s.buf) > 64<<10 {
		s.buf = nil // do not keep a huge key buffer alive
	}
	scratchPool.Put(s)
}

// verdict is what ServeHTTP keeps of a decision once the scratch is released.
type verdict struct {
	zone *zone
	key  identity.Token
	algorithms.Decision
}

// ServeHTTP decides the request against every zone that applies, sets the
// rate limit headers, and either passes the request on or refuses it.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if !h.enabled {
		return next.ServeHTTP(w, r)
	}
	v, refused, ok, err := h.decide(r)
	if err != nil {
		return err
	}
	if !ok {
		return next.ServeHTTP(w, r)
	}
	now := time.Now()
	if h.headers {
		setLegacyHeaders(w.Header(), v.zone, &v.Decision, now)
	}
	if !refused {
		return next.ServeHTTP(w, r)
	}
	return h.refuse(w, r, &v, now)
}

// decide runs the zones that match r through the store in one call. It
// returns the verdict to report (the refusing zone with the longest
// Retry-After, else the zone with the least remaining), whether the request
// is refused, and ok=false when no zone applies or the store failed (the
// request passes: fail open).
func (h *Handler) decide(r *http.Request) (v verdict, refused, ok bool, err error) {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	s := scratchPool.Get().(*scratch)
	defer s.release()

	for _, z := range h.zones {
		if len(z.matchers) > 0 {
			match, err := z.matchers.AnyMatchWithError(r)
			if err != nil {
				return v, false, false, err
			}
			if !match {
				continue
			}
		}
		var tok identity.Token
		tok, s.buf = z.deriver.Derive(repl, s.buf)
		s.reqs = append(s.reqs, algorithms.Request{Zone: z.name, Key: algorithms.Key(tok), Limit: z.limit, Cost: z.cost})
		s.zones = append(s.zones, z)
	}
	if len(s.reqs) == 0 {
		return v, false, false, nil
	}
	if n := len(s.reqs); cap(s.decs) < n {
		s.decs = make([]algorithms.Decision, n)
	} else {
		s.decs = s.decs[:n]
	}
	if err := h.store.Take(r.Context(), s.reqs, s.decs); err != nil {
		// Only remote stores fail; the failure policy arrives with them.
		// Until then a failed decision lets the request through.
		h.logger.Error("rate limit store failed; allowing the request", zap.Error(err))
		return v, false, false, nil
	}

	pick := -1
	for i := range s.decs {
		d := &s.decs[i]
		switch {
		case !d.Allowed:
			if !refused || d.RetryAfter > s.decs[pick].RetryAfter {
				pick = i
			}
			refused = true
		case refused:
		case pick < 0 || d.Remaining < s.decs[pick].Remaining ||
			d.Remaining == s.decs[pick].Remaining && d.ResetAfter > s.decs[pick].ResetAfter:
			pick = i
		}
	}
	return verdict{zone: s.zones[pick], key: identity.Token(s.reqs[pick].Key), Decision: s.decs[pick]}, refused, true, nil
}
