package caddytest_test

// The HTML report of `caddy rate-limit simulate` and the live page (the
// rate_limit_ui directive), opened in a real headless Chromium (Debian's
// package, installed by scripts/test-deps.sh), driven with chromedp.
// Screenshots go to $SLUICE_SCREENSHOTS, default bin/screenshots in the
// repository, for a person to look at.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/sluicehq/caddy-sluice/simulate"
)

// browser starts a headless Chromium for one test. It fails the test when
// Chromium cannot be found or started: never a silent skip.
func browser(t *testing.T) (context.Context, *consoleErrors) {
	t.Helper()
	var exe string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			exe = p
			break
		}
	}
	if exe == "" {
		t.Fatal("Chromium is not installed: run scripts/test-deps.sh (apt-get install chromium) — the browser tests need it")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	// Start the browser, then collect the console's errors and uncaught
	// exceptions for the rest of the test.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting Chromium (%s): %v", exe, err)
	}
	ce := &consoleErrors{}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				ce.add(m.String())
			}
		}
	}()
	return ctx, ce
}

type consoleErrors struct {
	mu  sync.Mutex
	msg []string
}

func (c *consoleErrors) add(s string) { c.mu.Lock(); c.msg = append(c.msg, s); c.mu.Unlock() }

func (c *consoleErrors) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.msg {
		t.Errorf("browser: %s", m)
	}
}

// screenshotDir is where screenshots go.
func screenshotDir(t *testing.T) string {
	dir := os.Getenv("SLUICE_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join("..", "bin", "screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG (less is JPEG)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	p := filepath.Join(screenshotDir(t), name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(p)
	t.Logf("screenshot: %s", abs)
}

// TestSimulateReportInBrowser renders the HTML report of a window-edge
// replay in Chromium: no console error, one chart per zone and per top
// key, each with two series (allowed, refused) of one point per bucket.
func TestSimulateReportInBrowser(t *testing.T) {
	ctx, ce := browser(t)
	cf := config("", `
:@A@ {
	rate_limit {
		zone @Z1@ {
			match {
				path /api/*
			}
			key {http.request.header.X-Client} {client_ip}
			events 20
			window 1m
			algorithm fixed_window
		}
		zone @Z2@ {
			key {client_ip}
			events 50
			window 1m
		}
	}
	respond "ok"
}`, "Z1", zoneName("report_api"), "Z2", zoneName("report_all"))
	rep, err := simulate.Run(simulate.Options{Config: adapt(t, cf), ConfigName: "report.Caddyfile",
		Traffic: "sawtooth:path=/api/items,from=0,to=40,period=30s,duration=3m,keys=6", Series: true})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "report.html")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.WriteHTML(f); err != nil {
		t.Fatal(err)
	}
	f.Close()

	wantCharts := 0
	points := len(rep.Zones[0].Series.Allowed)
	for _, z := range rep.Zones {
		wantCharts++
		for _, k := range z.TopKeys {
			if k.Series != nil {
				wantCharts++
			}
		}
		if len(z.Series.Allowed) != points {
			t.Errorf("zone %s: %d buckets, zone %s %d", z.Name, len(z.Series.Allowed), rep.Zones[0].Name, points)
		}
	}
	if points < 10 || wantCharts < 3 {
		t.Fatalf("report too small to check: %d points, %d charts", points, wantCharts)
	}
	if err := chromedp.Do(ctx, chromedp.Navigate("file://"+out), chromedp.WaitVisible("#summary")); err != nil {
		t.Fatal(err)
	}
	charts := eval[[]string](t, ctx, `[...document.querySelectorAll("svg.chart")].map(s => s.id)`)
	series := eval[[]string](t, ctx, `[...document.querySelectorAll("svg.chart")].map(s => String(s.querySelectorAll("polyline.series").length))`)
	pointAttrs := eval[[]string](t, ctx, `[...document.querySelectorAll("svg.chart polyline.series")].map(p => String(p.getAttribute("points").trim().split(/\s+/).length))`)
	if len(charts) != wantCharts {
		t.Errorf("%d charts, want %d (one per zone and per top key)", len(charts), wantCharts)
	}
	for i, s := range series {
		if s != "2" {
			t.Errorf("chart %d: %s series, want 2 (allowed, refused)", i, s)
		}
	}
	for i, p := range pointAttrs {
		if p != fmt.Sprint(points) {
			t.Errorf("polyline %d: %s points, want %d (one per bucket)", i, p, points)
		}
	}
	screenshot(t, ctx, "simulate-report.png")
	ce.check(t)
}

// TestLiveUIInBrowser opens the live page a site serves (rate_limit_ui),
// waits for a refusal to show, checks the zones' charts, and resets the
// refused key through the page's confirmation: the same-origin DELETE is
// answered and the key is full again.
func TestLiveUIInBrowser(t *testing.T) {
	tc := newTester(t)
	zl, za := zoneName("ui_login"), zoneName("ui_api")
	cf := config("", `
:@A@ {
	rate_limit {
`+uiLoginZone+`		zone @ZA@ {
			match {
				path /api/*
			}
			key {client_ip}
			events 100
			window 1m
		}
	}
	respond "ok"
}
:@B@ {
	rate_limit_ui /sluice/*
}`, "ZL", zl, "ZA", za)
	load(t, tc, cf)
	c := loopbackClient(1)
	for range 4 {
		get(t, c, siteA+"/login", "X-User: alice")
	}
	for range 5 {
		get(t, c, siteA+"/api/x")
	}
	peek := adminURL + "/rate_limit/zones/" + zl + "/keys/alice"
	expectExhausted(t, get(t, c, peek), "before the reset")

	ctx, ce := browser(t)
	wctx, cancelW := context.WithTimeout(ctx, 20*time.Second)
	defer cancelW()
	if err := chromedp.Do(wctx,
		chromedp.Navigate(siteB+"/sluice/"),
		chromedp.WaitVisible(`#recent tr[data-zone="`+zl+`"]`),
		// Two polls give the charts their first points.
		chromedp.WaitVisible(`#zones svg.spark[data-points="2"]`),
	); err != nil {
		failPage(t, ctx, ce, "live-ui-failed.png", err)
	}
	zoneRows := eval[[]string](t, ctx, `[...document.querySelectorAll("#zones tbody tr")].map(r => r.dataset.zone)`)
	sparks := eval[[]string](t, ctx, `[...document.querySelectorAll("#zones svg.spark")].map(s => s.dataset.points)`)
	sparkSeries := eval[[]string](t, ctx, `[...document.querySelectorAll("#zones svg.spark")].map(s => String(s.querySelectorAll("polyline.series").length))`)
	token := eval[string](t, ctx, `document.querySelector('#recent tr[data-zone="`+zl+`"]').dataset.token`)
	if strings.Join(zoneRows, ",") != strings.Join([]string{za, zl}, ",") && strings.Join(zoneRows, ",") != strings.Join([]string{zl, za}, ",") {
		t.Errorf("zone rows %v, want %s and %s", zoneRows, za, zl)
	}
	if len(sparks) != 2 || len(sparkSeries) != 2 || sparkSeries[0] != "2" || sparkSeries[1] != "2" {
		t.Errorf("charts: points %v, series %v; want 2 charts of 2 series", sparks, sparkSeries)
	}
	if !strings.HasPrefix(token, "h1-") {
		t.Errorf("refused key shown as %q, want a token (h1-...), never the raw key", token)
	}
	html := eval[string](t, ctx, `document.body.outerHTML`)
	if strings.Contains(html, "alice") {
		t.Error("the page shows the raw key")
	}
	screenshot(t, ctx, "live-ui.png")

	// Reset through the page: cancel first (nothing happens), then confirm.
	row := `#recent tr[data-zone="` + zl + `"] button.reset`
	if err := chromedp.Do(ctx,
		chromedp.Click(row),
		chromedp.WaitVisible("#confirm"),
		chromedp.Click("#confirm-cancel"),
		chromedp.WaitNotVisible("#confirm"),
	); err != nil {
		t.Fatal(err)
	}
	expectExhausted(t, get(t, c, peek), "after cancel")
	if err := chromedp.Do(ctx, chromedp.Click(row), chromedp.WaitVisible("#confirm")); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "live-ui-confirm.png")
	err := chromedp.Do(ctx,
		chromedp.Click("#confirm-ok"),
		chromedp.Poll[chromedp.Void](`document.querySelector("#detail").textContent.includes('"deleted": 1')`, chromedp.WithPollingTimeout(10*time.Second)),
	)
	detail := eval[string](t, ctx, `document.querySelector("#detail").textContent`)
	if err != nil {
		t.Fatalf("reset through the page: %v (detail %q)", err, detail)
	}
	if r := get(t, c, peek); !strings.Contains(r.body, `"found":false`) {
		t.Errorf("after the reset: the key still holds state: %s (page said %q)", r.body, detail)
	}
	if r := get(t, c, siteA+"/login", "X-User: alice"); r.code != http.StatusOK {
		t.Errorf("after the reset: POST /login answered %d, want 200", r.code)
	}
	screenshot(t, ctx, "live-ui-reset.png")
	ce.check(t)
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// failPage fails the test with what the page shows: a screenshot and the
// status line. (The test context may have run out: a fresh one reads them.)
func failPage(t *testing.T, ctx context.Context, ce *consoleErrors, name string, err error) {
	t.Helper()
	ce.check(t)
	sctx := ctx
	if status, e := chromedp.Run(sctx, chromedp.Evaluate[string](`document.body.innerText`)); e == nil {
		t.Logf("page text:\n%s", status)
	}
	screenshot(t, sctx, name)
	t.Fatal(err)
}

// TestLiveUIRowsInBrowser: 57 refusals of one key show as one row with its
// count (not one row per refusal), a concurrency zone's limit as its slots,
// and a refusal forwarded by on_exceed pass as passed, not report-only.
func TestLiveUIRowsInBrowser(t *testing.T) {
	tc := newTester(t)
	zl, zc, zp := zoneName("rows_login"), zoneName("rows_export"), zoneName("rows_soft")
	load(t, tc, config("", `
:@A@ {
	rate_limit {
`+uiLoginZone+`		zone @ZC@ {
			match {
				path /export
			}
			key {client_ip}
			concurrent 3
		}
		zone @ZP@ {
			match {
				path /soft
			}
			key {client_ip}
			events 1
			window 1h
			on_exceed pass
		}
	}
	respond "ok"
}
:@B@ {
	rate_limit_ui /sluice/*
}`, "ZL", zl, "ZC", zc, "ZP", zp))
	c := loopbackClient(1)
	for range 59 { // 2 allowed, 57 refused
		get(t, c, siteA+"/login", "X-User: alice")
	}
	for range 3 { // 2 allowed, 1 refused
		get(t, c, siteA+"/login", "X-User: bob")
	}
	get(t, c, siteA+"/export")
	for range 2 { // 1 allowed, 1 passed
		get(t, c, siteA+"/soft")
	}

	ctx, ce := browser(t)
	wctx, cancelW := context.WithTimeout(ctx, 20*time.Second)
	defer cancelW()
	if err := chromedp.Do(wctx,
		chromedp.Navigate(siteB+"/sluice/"),
		chromedp.WaitVisible(`#recent tr[data-zone="`+zp+`"]`),
	); err != nil {
		failPage(t, ctx, ce, "live-ui-rows-failed.png", err)
	}
	screenshot(t, ctx, "live-ui-rows.png")
	counts := eval[[]string](t, ctx, `[...document.querySelectorAll('#recent tr[data-zone="`+zl+`"]')].map(r => r.querySelector("td.count")?.textContent ?? "no count")`)
	slices.Sort(counts) // bob's and alice's last refusals may share a millisecond
	if strings.Join(counts, ",") != "1,57" {
		t.Errorf("zone %s: rows of refusal counts %v, want two rows, 1 (bob) and 57 (alice)", zl, counts)
	}
	tokens := eval[[]string](t, ctx, `[...document.querySelectorAll('#recent tr[data-zone="`+zl+`"]')].map(r => r.dataset.token)`)
	if len(tokens) == 2 && tokens[0] == tokens[1] {
		t.Errorf("zone %s: the same token on two rows: %v", zl, tokens)
	}
	passed := eval[[]string](t, ctx, `[...document.querySelectorAll('#recent tr[data-zone="`+zp+`"]')].map(r => r.querySelector("td.zone")?.textContent ?? r.cells[1].textContent)`)
	if len(passed) != 1 || passed[0] != zp+" (passed)" {
		t.Errorf("on_exceed pass zone's rows %q, want one %q", passed, zp+" (passed)")
	}
	limit := eval[string](t, ctx, `document.querySelector('#zones tr[data-zone="`+zc+`"] td.limit')?.textContent ?? document.querySelector('#zones tr[data-zone="`+zc+`"] td:nth-child(3)').textContent`)
	if limit != "3 in flight" {
		t.Errorf("concurrency zone's limit shown as %q, want %q", limit, "3 in flight")
	}
	soft := eval[string](t, ctx, `document.querySelector('#zones tr[data-zone="`+zp+`"] td').textContent`)
	if soft != zp+" (on_exceed pass)" {
		t.Errorf("on_exceed pass zone shown as %q, want %q", soft, zp+" (on_exceed pass)")
	}
	ce.check(t)
}

// TestLiveUICrossSiteInBrowser: a page on another site (127.0.0.1, while
// the live page is on localhost) tries to reset a refused key through
// rate_limit_ui with a form POST, fetches (DELETE with CORS, POST no-cors)
// and an <img>. The live page's site answers every CORS preflight with
// "anything goes" (a permissive CORS setup, as API sites often have), so
// the browser does send the DELETE: the same-origin check alone refuses
// it. The site has no authentication here, so nothing else stands in the
// way (TestLiveUIDirective checks basic_auth). The key is still refused
// after.
func TestLiveUICrossSiteInBrowser(t *testing.T) {
	tc := newTester(t)
	zl := zoneName("xsite_login")
	target := "http://localhost:" + strconv.Itoa(portB) + "/sluice/zones/" + zl + "/keys/alice"
	attack := `<!DOCTYPE html><title>attack</title>
<iframe name="sink"></iframe>
<form id="f" method="POST" action="` + target + `" target="sink"><input name="x" value="1"></form>
<script>
const target = "` + target + `";
const out = {};
const waits = [
  new Promise((ok) => { const i = new Image(); i.onload = i.onerror = () => { out.img = "sent"; ok(); }; i.src = target + "?img"; }),
  new Promise((ok) => { document.querySelector("iframe").onload = () => { out.form = "sent"; ok(); }; document.getElementById("f").submit(); }),
];
for (const [name, opts] of [["delete", { method: "DELETE" }], ["post_nocors", { method: "POST", mode: "no-cors" }]]) {
  waits.push(fetch(target, opts).then((r) => { out[name] = String(r.status); }, (e) => { out[name] = "failed: " + e.message; }));
}
Promise.all(waits).then(() => { document.body.dataset.done = JSON.stringify(out); });
</script>`
	load(t, tc, config("", crossSiteSites(attack), "ZL", zl))
	c := loopbackClient(1)
	for range 4 {
		get(t, c, siteA+"/login", "X-User: alice")
	}
	peek := adminURL + "/rate_limit/zones/" + zl + "/keys/alice"
	expectExhausted(t, get(t, c, peek), "before")

	ctx, ce := browser(t)
	wctx, cancelW := context.WithTimeout(ctx, 20*time.Second)
	defer cancelW()
	if err := chromedp.Do(wctx,
		chromedp.Navigate("http://127.0.0.1:"+strconv.Itoa(portA)+"/attack"),
		chromedp.WaitVisible(`body[data-done]`),
	); err != nil {
		failPage(t, ctx, ce, "live-ui-xsite-failed.png", err)
	}
	var out map[string]string
	if err := json.Unmarshal([]byte(eval[string](t, ctx, `document.body.dataset.done`)), &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("the other site's attempts: %v", out)
	if out["form"] != "sent" || out["img"] != "sent" {
		t.Errorf("the form or the image was not sent: %v", out)
	}
	// The DELETE got past the browser (the permissive preflight) and was
	// answered by the directive's check: 403.
	if out["delete"] != "403" {
		t.Errorf("the cross-site DELETE: %q, want 403 from the same-origin check", out["delete"])
	}
	expectExhausted(t, get(t, c, peek), "after the other site's attempts")
	screenshot(t, ctx, "live-ui-xsite.png")
}

// TestLiveUISiteWideZoneInBrowser loads docs/reference.md's site whose zone
// limits the whole site but the live page (live-page-site-wide), spends
// the operator's address's budget, and opens the page in Chromium behind
// the snippet's basic_auth: the page renders the zone and its charts from
// its own polling, while the site refuses the same address.
func TestLiveUISiteWideZoneInBrowser(t *testing.T) {
	snippet := docSnippet(t, "reference.md", "live-page-site-wide")
	z := zoneName("per_client")
	// A window of an hour: no event comes back while the page polls. The
	// hash of cost 4 (operatorHash): the snippet's cost 14 takes seconds
	// under -race.
	hash := regexp.MustCompile(`\$2a\$14\$\S+`).FindString(snippet)
	for from, to := range map[string]string{"example.com {": ":@A@ {", "reverse_proxy localhost:9000": `respond "ok"`,
		"zone per_client {": "zone " + z + " {", "window 1m": "window 1h", hash: operatorHash} {
		if strings.Count(snippet, from) != 1 {
			t.Fatalf("the snippet has %q %d times, want once:\n%s", from, strings.Count(snippet, from), snippet)
		}
		snippet = strings.Replace(snippet, from, to, 1)
	}
	load(t, newTester(t), config("", snippet))
	c := loopbackClient(1)
	codes := map[int]int{}
	for range 11 {
		codes[get(t, c, siteA+"/").code]++
	}
	if codes[200] != 10 || codes[429] != 1 {
		t.Fatalf("the site: %v, want 10 of 200 then 429 (events 10 an hour)", codes)
	}

	ctx, ce := browser(t)
	auth := "Basic " + base64.StdEncoding.EncodeToString([]byte("operator:right"))
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": auth}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancelW := context.WithTimeout(ctx, 30*time.Second)
	defer cancelW()
	if err := chromedp.Do(wctx,
		chromedp.Navigate(siteA+"/sluice/"),
		chromedp.WaitVisible(`#zones tbody tr[data-zone="`+z+`"]`),
		// Two polls give the chart its first points.
		chromedp.WaitVisible(`#zones svg.spark[data-points="2"]`),
	); err != nil {
		failPage(t, ctx, ce, "live-ui-site-wide-failed.png", err)
	}
	if rows := eval[int](t, ctx, `document.querySelectorAll("#zones tbody tr").length`); rows != 1 {
		t.Errorf("%d zone rows, want 1", rows)
	}
	screenshot(t, ctx, "live-ui-site-wide.png")
	if r := get(t, c, siteA+"/"); r.code != http.StatusTooManyRequests {
		t.Errorf("the site after the page's polls: %d, want 429 (the zone still holds)", r.code)
	}
	ce.check(t)
}

// crossSiteSites is the cross-site tests' config: site A (the login zone)
// serves the attacker's page at /attack; site B serves the live page
// behind the widest CORS a careless operator could add, so only the
// page's own same-origin rule stands between the attack and the page.
func crossSiteSites(attack string) string {
	return `
:@A@ {
	rate_limit {
` + uiLoginZone + `	}
	handle /attack {
		header Content-Type "text/html; charset=utf-8"
		respond ` + "`" + attack + "`" + `
	}
	respond "ok"
}
:@B@ {
	header Access-Control-Allow-Origin *
	header Access-Control-Allow-Methods *
	header Access-Control-Allow-Headers *
	@preflight method OPTIONS
	handle @preflight {
		respond 204
	}
	rate_limit_ui /sluice/*
}`
}
