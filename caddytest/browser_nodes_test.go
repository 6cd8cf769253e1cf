package caddytest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// TestLiveUIClusterNodesInBrowser: on a Redis Cluster store the live page
// shows a breaker per master; one master frozen, its line turns open while
// the others stay closed.
func TestLiveUIClusterNodesInBrowser(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	tc := newTester(t)
	z := zoneName("ui_nodes")
	cf := config("", `
:@A@ {
	rate_limit {
		zone @Z@ {
			key {http.request.header.X-User}
			events 1000
			window 1h
		}
		store redis {
			cluster @ADDRS@
			breaker {
				cooldown 1m
			}
		}
	}
	respond "ok"
}
:@B@ {
	rate_limit_ui /sluice/*
}`, "Z", z, "ADDRS", strings.Join(cl.Addrs(), " "))
	load(t, tc, cf)
	c := loopbackClient(1)
	// Users on every master (30 users: each master gets one but with odds
	// of 3·(2/3)^30, about 1e-5, to miss).
	for i := range 30 {
		get(t, c, siteA+"/", fmt.Sprintf("X-User: u%d-%s", i, nonce))
	}
	frozen := cl.Nodes[0]
	frozen.Freeze(t)
	for i := range 30 {
		get(t, c, siteA+"/", fmt.Sprintf("X-User: u%d-%s", i, nonce))
	}

	ctx, ce := browser(t)
	wctx, cancelW := context.WithTimeout(ctx, 20*time.Second)
	defer cancelW()
	if err := chromedp.Do(wctx,
		chromedp.Navigate(siteB+"/sluice/"),
		chromedp.WaitVisible(`#zones tr[data-zone="`+z+`"] div.node`),
	); err != nil {
		frozen.Thaw(t)
		failPage(t, ctx, ce, "live-ui-nodes-failed.png", err)
	}
	lines := eval[[]string](t, ctx, `[...document.querySelectorAll('#zones tr[data-zone="`+z+`"] div.node')].map(d => d.dataset.node + " " + d.querySelector(".badge").textContent)`)
	screenshot(t, ctx, "live-ui-nodes.png")
	frozen.Thaw(t)
	want := map[string]string{}
	for _, n := range cl.Nodes {
		want[n.Addr] = "closed"
	}
	want[frozen.Addr] = "open"
	got := map[string]string{}
	for _, l := range lines {
		addr, state, _ := strings.Cut(l, " ")
		got[addr] = state
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("node lines %q, want %v", lines, want)
	}
	ce.check(t)
}
