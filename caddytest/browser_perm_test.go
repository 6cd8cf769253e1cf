package caddytest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestLiveUIStorePermissionInBrowser (issue 35): a store whose Redis user
// may run neither Functions nor EVALSHA shows, under the zone's store on
// the live page, the permission to grant, not an unreachable Redis.
func TestLiveUIStorePermissionInBrowser(t *testing.T) {
	srv := redistest.Start(t)
	url := srv.User(t, "ui-noscripts", "~*", "+@all", "-function", "-fcall", "-fcall_ro", "-evalsha", "-eval", "-script")
	tc := newTester(t)
	z := zoneName("ui_perm")
	load(t, tc, config("", `
:@A@ {
	rate_limit {
		zone @Z@ {
			key {http.request.header.X-User}
			events 10
			window 1h
		}
		store redis @URL@
	}
	respond "ok"
}
:@B@ {
	rate_limit_ui /sluice/*
}`, "Z", z, "URL", url))
	get(t, loopbackClient(1), siteA+"/", "X-User: u-"+nonce)

	ctx, ce := browser(t)
	wctx, cancelW := context.WithTimeout(ctx, 20*time.Second)
	defer cancelW()
	if err := chromedp.Do(wctx,
		chromedp.Navigate(siteB+"/sluice/"),
		chromedp.WaitVisible(`#zones tr[data-zone="`+z+`"] div.problem`),
	); err != nil {
		failPage(t, ctx, ce, "live-ui-perm-failed.png", err)
	}
	text := eval[string](t, ctx, `document.querySelector('#zones tr[data-zone="`+z+`"] div.problem').textContent`)
	screenshot(t, ctx, "live-ui-perm.png")
	if !strings.Contains(text, "grant +evalsha") {
		t.Errorf("the store's problem on the live page: %q; want it to name +evalsha", text)
	}
	ce.check(t)
}
