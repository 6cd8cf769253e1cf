package fleet_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// Overrides across a fleet: three Caddy processes sharing one Redis, a
// zone of 2 per hour keyed on X-User. An override set through one
// instance's admin API decides the next request of each of the three
// (the override is read by the decision's own script call: no cache to
// expire, no reload); its deletion through another instance, and its
// expiry, restore the zone's limit on all three. The audit lines (set,
// deleted, expired) are in the logs, and the overrides metric counts it.
func TestOverridesFleet(t *testing.T) {
	r := redistest.Start(t)
	zone := "ov_fleet"
	routes := fmt.Sprintf(`rate_limit {
	zone %s {
		key {http.request.header.X-User}
		events 2
		window 1h
	}
	store redis %s {
		timeout 250ms
	}
}
respond "ok"`, zone, r.URL())
	procs := make([]*caddyProc, 3)
	for i := range procs {
		procs[i] = startCaddy(t, fmt.Sprintf("ov-%d", i), "", routes)
	}
	c := newClient(4)
	defer c.CloseIdleConnections()
	admin := func(p *caddyProc, method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, p.adminURL(path), strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	base := "/rate_limit/zones/" + zone + "/overrides/"

	// Raised: 2 spent of the zone's 2 on instance 0 (none refused yet, so
	// no instance holds a refusal in its deny cache), then 5 through
	// instance 1's admin API: each instance admits its next request, 1 of
	// the 3 left each, and shows the limit of 5.
	user := "raise-" + nonce
	for i := range 2 {
		expectCode(t, mustGet(t, c, procs[0].url("/"), "X-User: "+user), 200, fmt.Sprintf("request %d of 2", i+1))
	}
	if code, body := admin(procs[1], "PUT", base+user, `{"events": 5, "window": "1h", "expires_in": "1h", "reason": "fleet test"}`); code != 200 {
		t.Fatalf("PUT through instance 1: %d %s", code, body)
	}
	for i, p := range procs {
		res := mustGet(t, c, p.url("/"), "X-User: "+user)
		expectCode(t, res, 200, fmt.Sprintf("instance %d under the raised limit", i))
		expectRemaining(t, res, 5, 2-i, fmt.Sprintf("instance %d under the raised limit", i))
	}
	// Every instance's admin view of the key shows it.
	for i, p := range procs {
		code, body := admin(p, "GET", "/rate_limit/zones/"+zone+"/keys/"+user, "")
		var peek struct {
			Limit, Remaining int64
			Overrides        []struct{ Reason string }
		}
		if code != 200 || json.Unmarshal([]byte(body), &peek) != nil || peek.Limit != 5 || peek.Remaining != 0 || len(peek.Overrides) != 1 || peek.Overrides[0].Reason != "fleet test" {
			t.Errorf("instance %d's view of the key: %d %s", i, code, body)
		}
	}

	// Deleted through instance 2: 5 spent of the zone's 2, each refuses.
	if code, body := admin(procs[2], "DELETE", base+user, ""); code != 200 {
		t.Fatalf("DELETE through instance 2: %d %s", code, body)
	}
	for i, p := range procs {
		res := mustGet(t, c, p.url("/"), "X-User: "+user)
		expectCode(t, res, http.StatusTooManyRequests, fmt.Sprintf("instance %d after the delete", i))
	}

	// Blocked through instance 0: each instance refuses a fresh key at once.
	blocked := "block-" + nonce
	if code, body := admin(procs[0], "PUT", base+blocked, `{"block": true, "expires_in": "3s", "reason": "retry loop"}`); code != 200 {
		t.Fatalf("PUT block: %d %s", code, body)
	}
	for i, p := range procs {
		expectCode(t, mustGet(t, c, p.url("/"), "X-User: "+blocked), http.StatusTooManyRequests, fmt.Sprintf("instance %d, blocked", i))
	}
	// Expired (by Redis: its key's PXAT): the zone's limit on each again.
	// Waiting for the key to go is waiting for the event, not timing it.
	okeys := scanKeys(t, r, "*"+zone+"*:o")
	if len(okeys) != 1 {
		t.Fatalf("Redis holds override keys %v, want one", okeys)
	}
	if _, gone := waitFor(10*time.Second, func() bool { return len(scanKeys(t, r, "*"+zone+"*:o")) == 0 }); !gone {
		t.Fatalf("the override's key %s outlived its expiry by 10s", okeys[0])
	}
	for i, p := range procs {
		res := mustGet(t, c, p.url("/"), "X-User: "+blocked)
		expectCode(t, res, 200, fmt.Sprintf("instance %d after the block expired", i))
		expectRemaining(t, res, 2, 1-min(i, 1), fmt.Sprintf("instance %d after the block expired", i))
		if i == 1 {
			break // 2 of 2 spent
		}
	}

	// The audit: set and deleted where they were done, expired where it
	// was collected (one instance's sweep, every 5s).
	for _, a := range []struct {
		p    *caddyProc
		want string
	}{{procs[1], `"msg":"override set"`}, {procs[2], `"msg":"override deleted"`}, {procs[0], `"reason":"retry loop"`}} {
		if !strings.Contains(a.p.logText(), a.want) {
			t.Errorf("caddy %s's log has no %s line", a.p.name, a.want)
		}
	}
	expiredLogged := func() bool {
		for _, p := range procs {
			for _, l := range strings.Split(p.logText(), "\n") {
				if strings.Contains(l, `"msg":"override expired"`) && strings.Contains(l, `"reason":"retry loop"`) {
					return true
				}
			}
		}
		return false
	}
	if _, ok := waitFor(15*time.Second, expiredLogged); !ok {
		t.Errorf("no instance logged the block's expiry within 15s")
	}
	// The listing is empty again, on every instance.
	for i, p := range procs {
		code, body := admin(p, "GET", strings.TrimSuffix(base, "/"), "")
		var list struct{ Overrides []any }
		if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list.Overrides) != 0 {
			t.Errorf("instance %d's listing: %d %s", i, code, body)
		}
	}
	// The metric, on the instance that listed last.
	_, metrics := admin(procs[2], "GET", "/metrics", "")
	if want := `caddy_rate_limit_overrides{zone="` + zone + `"} 0`; !strings.Contains(metrics, want) {
		t.Errorf("the metrics have no %s", want)
	}
}
