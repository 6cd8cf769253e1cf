package caddytest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestAdaptiveLiveUIInBrowser: the live page shows an adaptive zone's
// learnt limit (fixed at 4 here), its controller, and, once a window of
// latencies has closed, the latency and baseline it measured.
func TestAdaptiveLiveUIInBrowser(t *testing.T) {
	tc := newTester(t)
	za := zoneName("ui_adaptive")
	load(t, tc, config("", `
:@A@ {
	rate_limit {
		zone @ZA@ {
			key static
			concurrent adaptive {
				minimum 4
				maximum 4
				window 1ms
			}
		}
	}
	respond "ok"
}
:@B@ {
	rate_limit_ui /sluice/*
}`, "ZA", za))
	c := loopbackClient(1)
	for i := 0; adaptiveListing(t, za)["latency_ms"] == 0.0; i++ { // until a window (10 samples, 1ms) closes
		if i == 100 {
			t.Fatalf("no window of latencies closed after 1000 requests: %v", adaptiveListing(t, za))
		}
		for range 10 {
			get(t, c, siteA+"/")
		}
	}
	ctx, ce := browser(t)
	wctx, cancelW := context.WithTimeout(ctx, 20*time.Second)
	defer cancelW()
	sel := `#zones tr[data-zone="` + za + `"]`
	if err := chromedp.Do(wctx, chromedp.Navigate(siteB+"/sluice/"), chromedp.WaitVisible(sel)); err != nil {
		failPage(t, ctx, ce, "live-ui-adaptive-failed.png", err)
	}
	screenshot(t, ctx, "live-ui-adaptive.png")
	limit := eval[string](t, ctx, `document.querySelector('`+sel+` td.limit')?.textContent ?? document.querySelector('`+sel+` td:nth-child(3)').textContent`)
	if !strings.HasPrefix(limit, "4 in flight (adaptive aimd; latency ") || !strings.Contains(limit, "baseline ") {
		t.Errorf("adaptive zone's limit shown as %q, want 4 in flight, the controller, the latency and baseline", limit)
	}
	ce.check(t)
}
