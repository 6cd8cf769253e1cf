package caddytest_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestLiveUIOverridesInBrowser: on the live page (rate_limit_ui), the
// override form raises an exhausted key's limit (the site admits it again,
// showing the new limit), the overrides table lists it, and its delete
// button removes it (the site refuses the key again). Screenshots:
// live-ui-override.png, live-ui-override-deleted.png.
func TestLiveUIOverridesInBrowser(t *testing.T) {
	tc := newTester(t)
	zl := zoneName("ovui_login")
	load(t, tc, config("", `
:@A@ {
	rate_limit {
`+uiLoginZone+`	}
	respond "ok"
}
:@B@ {
	rate_limit_ui /sluice/*
}`, "ZL", zl))
	c := loopbackClient(1)
	for range 3 {
		get(t, c, siteA+"/login", "X-User: alice")
	}
	expect(t, get(t, c, siteA+"/login", "X-User: alice"), http.StatusTooManyRequests, "before the override")

	ctx, ce := browser(t)
	wctx, cancelW := context.WithTimeout(ctx, 20*time.Second)
	defer cancelW()
	if err := chromedp.Do(wctx,
		chromedp.Navigate(siteB+"/sluice/"),
		chromedp.WaitReady(`#ov-zone option[value="`+zl+`"]`),
		chromedp.SetValue(`#ov-zone`, zl),
		chromedp.SendKeys(`#ov-key`, "alice"),
		chromedp.SendKeys(`#ov-events`, "10"),
		chromedp.SendKeys(`#ov-window`, "1h"),
		chromedp.SendKeys(`#ov-expires`, "2h"),
		chromedp.SendKeys(`#ov-reason`, "partner migration"),
		chromedp.Click(`#ov-set`),
		chromedp.WaitVisible(`#overrides tr[data-zone="`+zl+`"]`),
	); err != nil {
		failPage(t, ctx, ce, "live-ui-override-failed.png", err)
	}
	row := eval[string](t, ctx, `document.querySelector('#overrides tr[data-zone="`+zl+`"]').innerText`)
	if !strings.Contains(row, "10 / 1h0m0s") || !strings.Contains(row, "partner migration") || strings.Contains(row, "alice") {
		t.Errorf("the override's row: %q, want its limit and reason, and its token, never the raw key", row)
	}
	screenshot(t, ctx, "live-ui-override.png")
	r := expect(t, get(t, c, siteA+"/login", "X-User: alice"), 200, "under the override")
	expectLimitHeaders(t, r, 10, 7, "under the override")

	if err := chromedp.Do(wctx,
		chromedp.Click(`#overrides tr[data-zone="`+zl+`"] button.ov-delete`),
		chromedp.WaitNotPresent(`#overrides tr[data-zone="`+zl+`"]`),
	); err != nil {
		failPage(t, ctx, ce, "live-ui-override-failed.png", err)
	}
	screenshot(t, ctx, "live-ui-override-deleted.png")
	expect(t, get(t, c, siteA+"/login", "X-User: alice"), http.StatusTooManyRequests, "after the delete")
	ce.check(t)
}

// TestLiveUIOverrideCrossSiteInBrowser: another site's page tries to set
// an override through the live page's JSON (a PUT with a JSON body, after
// a preflight the live page's site answers permissively, and a no-cors
// POST): the same-origin check refuses both, and no override is set.
func TestLiveUIOverrideCrossSiteInBrowser(t *testing.T) {
	tc := newTester(t)
	zl := zoneName("ovxsite_login")
	target := "http://localhost:" + strconv.Itoa(portB) + "/sluice/zones/" + zl + "/overrides/mallory"
	attack := `<!DOCTYPE html><title>attack</title>
<script>
const target = "` + target + `";
const out = {};
const body = JSON.stringify({ unlimited: true, expires_in: "1h", reason: "attack" });
Promise.all([
  fetch(target, { method: "PUT", headers: { "Content-Type": "application/json" }, body }).then((r) => { out.put = String(r.status); }, (e) => { out.put = "failed: " + e.message; }),
  fetch(target, { method: "POST", mode: "no-cors", body }).then((r) => { out.post_nocors = r.type; }, (e) => { out.post_nocors = "failed: " + e.message; }),
]).then(() => { document.body.dataset.done = JSON.stringify(out); });
</script>`
	load(t, tc, config("", crossSiteSites(attack), "ZL", zl))
	ctx, ce := browser(t)
	wctx, cancelW := context.WithTimeout(ctx, 20*time.Second)
	defer cancelW()
	if err := chromedp.Do(wctx,
		chromedp.Navigate("http://127.0.0.1:"+strconv.Itoa(portA)+"/attack"),
		chromedp.WaitVisible(`body[data-done]`),
	); err != nil {
		failPage(t, ctx, ce, "live-ui-override-xsite-failed.png", err)
	}
	var out map[string]string
	if err := json.Unmarshal([]byte(eval[string](t, ctx, `document.body.dataset.done`)), &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("the other site's attempts: %v", out)
	if out["put"] != "403" {
		t.Errorf("the cross-site PUT: %q, want 403 from the same-origin check", out["put"])
	}
	code, list := adminAPI(t, "GET", "/rate_limit/zones/"+zl+"/overrides")
	if ovs, _ := list["overrides"].([]any); code != 200 || len(ovs) != 0 {
		t.Errorf("after the other site's attempts: %d %v, want no override", code, list)
	}
	c := loopbackClient(1)
	for range 2 {
		get(t, c, siteA+"/login", "X-User: mallory")
	}
	expect(t, get(t, c, siteA+"/login", "X-User: mallory"), http.StatusTooManyRequests, "mallory's third login")
	screenshot(t, ctx, "live-ui-override-xsite.png")
}
