package caddytest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestLiveUISyncInBrowser: the live page shows a zone in the asynchronous
// mode, its interval and the lag of its last sync; with Redis stopped, the
// failed syncs and the units held.
func TestLiveUISyncInBrowser(t *testing.T) {
	srv := redistest.Start(t)
	tc := newTester(t)
	z := zoneName("ui_sync")
	cf := config("", `
:@A@ {
	rate_limit {
		zone @Z@ {
			key {http.request.header.X-User}
			events 1000
			window 1h
			algorithm fixed_window
			sync 20ms
		}
		store redis @URL@
	}
	respond "ok"
}
:@B@ {
	rate_limit_ui /sluice/*
}`, "Z", z, "URL", srv.URL())
	load(t, tc, cf)
	c := loopbackClient(1)
	get(t, c, siteA+"/", "X-User: a-"+nonce)
	waitUntil(t, 10*time.Second, "a sync", func() bool { return jsonInt(t, syncAdmin(t, z), "lag_ms") >= 0 })

	ctx, ce := browser(t)
	line := func(want string) string {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		sel := `#zones tr[data-zone="` + z + `"] div.sync`
		if err := chromedp.Do(wctx, chromedp.Navigate(siteB+"/sluice/"), chromedp.WaitVisible(sel)); err != nil {
			failPage(t, ctx, ce, "live-ui-sync-failed.png", err)
		}
		var text string
		deadline := time.Now().Add(10 * time.Second)
		for {
			text = eval[string](t, ctx, `document.querySelector('`+sel+`').textContent`)
			if strings.Contains(text, want) || time.Now().After(deadline) {
				return text
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if got := line("lag"); !strings.Contains(got, "async, sync every 20ms, lag ") || strings.Contains(got, "none yet") {
		t.Errorf("sync line %q, want the interval and a lag", got)
	}
	screenshot(t, ctx, "live-ui-sync.png")
	srv.Stop()
	for range 3 {
		get(t, c, siteA+"/", "X-User: a-"+nonce)
	}
	if got := line("failed syncs"); !strings.Contains(got, "failed syncs, 3 units held") {
		t.Errorf("sync line %q with Redis stopped, want the failed syncs and the 3 units held", got)
	}
	screenshot(t, ctx, "live-ui-sync-outage.png")
	ce.check(t)
}
