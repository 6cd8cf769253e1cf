package caddytest_test

import (
	"testing"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestOOMOverLimitStillRefused (issue 35): a Redis under noeviction with
// its memory full refuses every write. A client already over its limit is
// still refused (Redis decides the refusal read-only), under fail open and
// fail local, with the deny cache off (so every request reaches Redis);
// a new client, whose admission is a write, goes through the fail policy.
func TestOOMOverLimitStillRefused(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	open, local := zoneName("oom_open"), zoneName("oom_local")
	load(t, tc, config("", `
http://localhost:@A@ {
	handle /open {
		rate_limit {
			zone @OPEN@ {
				key {http.request.header.X-User}
				events 3
				window 1h
				fail open
			}
			store redis @URL@ {
				deny_cache off
			}
		}
		respond "ok"
	}
	handle /local {
		rate_limit {
			zone @LOCAL@ {
				key {http.request.header.X-User}
				events 3
				window 1h
				fail local
			}
			store redis @URL@ {
				deny_cache off
			}
		}
		respond "ok"
	}
}`, "OPEN", open, "LOCAL", local, "URL", srv.URL()))
	c := loopbackClient(4)
	user := "X-User: over-" + nonce
	for _, path := range []string{"/open", "/local"} {
		for i := range 4 {
			want := 200
			if i == 3 {
				want = 429
			}
			expect(t, get(t, c, siteA+path, user), want, path+" before OOM")
		}
	}
	srv.FillMemory(t)
	for _, path := range []string{"/open", "/local"} {
		passed := 0
		for i := range 10 {
			if get(t, c, siteA+path, user).code == 200 {
				passed++
			}
			// A new client's admission fails for memory: the fail policy
			// admits it (open; local: this instance's memory, from zero).
			expect(t, get(t, c, siteA+path, "X-User: new-"+nonce+"-"+path+"-"+string(rune('a'+i))), 200, path+" a new client under OOM")
		}
		if passed != 0 {
			t.Errorf("%s: %d of 10 requests of a client over its limit passed while Redis was out of memory; want 0", path, passed)
		}
	}
}
