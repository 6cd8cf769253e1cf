package caddytest_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// offSwitchPath is where the handler's enabled field lives in the JSON the
// Caddyfile below adapts to (site route → subroute → first handler).
const offSwitchPath = "/config/apps/http/servers/srv0/routes/0/handle/0/routes/0/handle/0/enabled"

func patchEnabled(t *testing.T, value string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPatch, adminURL+offSwitchPath, strings.NewReader(value))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("PATCH enabled=%s: %v", value, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PATCH enabled=%s: %d %s", value, resp.StatusCode, b)
	}
}

// TestOffSwitchByPatch: PATCHing the one `enabled` field through Caddy's
// admin API turns the directive into a pass-through and back, without
// losing the counters.
func TestOffSwitchByPatch(t *testing.T) {
	tc := newTester(t)
	zone := zoneName("offswitch")
	load(t, tc, config("", `http://localhost:@A@ {
	rate_limit {
		zone @ZONE@ {
			key {http.request.header.X-User}
			events 2
			window 1h
		}
		enabled true
	}
	respond "ok"
}
`, "ZONE", zone))
	c := tc.Client
	expect(t, get(t, c, siteA+"/", "X-User: o"), 200, "first")
	expect(t, get(t, c, siteA+"/", "X-User: o"), 200, "second")
	expect(t, get(t, c, siteA+"/", "X-User: o"), 429, "third")

	patchEnabled(t, "false")
	closeIdle(c)
	for i := 0; i < 5; i++ {
		r := expect(t, get(t, c, siteA+"/", "X-User: o"), 200, "switched off")
		if r.header.Get("X-Ratelimit-Limit") != "" {
			t.Fatalf("switched off, yet rate limit headers: %v", r.header)
		}
	}

	patchEnabled(t, "true")
	closeIdle(c)
	// Nothing was charged while off, and the counter survived: still refused.
	expect(t, get(t, c, siteA+"/", "X-User: o"), 429, "switched back on")
}

func closeIdle(c *http.Client) {
	if tr, ok := c.Transport.(*http.Transport); ok {
		tr.CloseIdleConnections()
	}
}
