package admin

import (
	_ "embed"
	"net/http"
	"slices"
	"time"
)

// The live page, served by the rate_limit_ui directive (uihandler.go): a
// small HTML page and its script (embedded: no external asset, nothing
// fetched but the JSON beside it), polling zones (limits, store and breaker
// state) and activity (decision counters and the keys each zone refused
// last, as tokens). Its peek and reset buttons call the zones/<zone>/tokens/
// <token> endpoint beside it, after a confirmation. The admin API answers
// the same JSON under /rate_limit/ for curl and scripts.

//go:embed ui/ui.html
var uiHTML []byte

//go:embed ui/ui.js
var uiJS []byte

// uiCSP: the page runs only its own script and talks only to its origin.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func serveStatic(w http.ResponseWriter, r *http.Request, ctype string, body []byte) error {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return methodNotAllowed(w, http.MethodGet)
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	_, err := w.Write(body)
	return err
}

func serveUIPage(w http.ResponseWriter, r *http.Request) error {
	return serveStatic(w, r, "text/html; charset=utf-8", uiHTML)
}

func serveUIScript(w http.ResponseWriter, r *http.Request) error {
	return serveStatic(w, r, "text/javascript; charset=utf-8", uiJS)
}

// activityJSON is GET /rate_limit/activity.
type activityJSON struct {
	// NowMs is the server's clock (Unix ms), for the ages of refusals.
	NowMs int64              `json:"now_ms"`
	Zones []zoneActivityJSON `json:"zones"`
}

type zoneActivityJSON struct {
	Name string `json:"name"`
	// Counters since the process started (they survive reloads):
	// allowed, refused (by this zone), vetoed (allowed by this zone,
	// refused by another), report_only_refused (would-be refusals).
	Allowed           int64 `json:"allowed"`
	Refused           int64 `json:"refused"`
	Vetoed            int64 `json:"vetoed"`
	ReportOnlyRefused int64 `json:"report_only_refused"`
	// Recent are the keys the zone refused last (up to 32), as tokens,
	// each once, refused most recently first.
	Recent []recentJSON `json:"recent"`
}

type recentJSON struct {
	Token string `json:"token"`
	// Count: the key's refusals since it was remembered.
	Count int64 `json:"count"`
	// At, AtMs, RetryAfterMs: its last refusal.
	At           string `json:"at"`
	AtMs         int64  `json:"at_ms"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	// ReportOnly: a report-only zone's would-be refusal; Passed: a
	// refusal forwarded by on_exceed pass.
	ReportOnly bool `json:"report_only,omitempty"`
	Passed     bool `json:"passed,omitempty"`
}

// serveActivity answers GET activity (/rate_limit/activity on the admin
// API) for the zones of the active configuration.
func serveActivity(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodGet {
		return methodNotAllowed(w, http.MethodGet)
	}
	zs := activeZones()
	names := make([]string, 0, len(zs))
	for n := range zs {
		names = append(names, n)
	}
	slices.Sort(names)
	out := activityJSON{NowMs: time.Now().UnixMilli(), Zones: []zoneActivityJSON{}}
	for _, n := range names {
		a := ActivityOf(n)
		zj := zoneActivityJSON{
			Name: n, Allowed: a.Allowed.Load(), Refused: a.Refused.Load(), Vetoed: a.Vetoed.Load(),
			ReportOnlyRefused: a.ReportOnly.Load(), Recent: []recentJSON{},
		}
		for _, rf := range a.last() {
			zj.Recent = append(zj.Recent, recentJSON{
				Token: rf.token.String(), Count: rf.count, At: time.UnixMilli(rf.at).UTC().Format(time.RFC3339Nano), AtMs: rf.at,
				RetryAfterMs: rf.retryMs, ReportOnly: rf.reportOnly, Passed: rf.passed,
			})
		}
		out.Zones = append(out.Zones, zj)
	}
	return writeJSON(w, out)
}
