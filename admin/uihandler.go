package admin

import (
	"errors"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(UI{})
	httpcaddyfile.RegisterHandlerDirective("rate_limit_ui", parseUICaddyfile)
	// Where Caddy orders metrics (just after respond), but before respond, so
	// that a site's catch-all respond, reverse_proxy or file_server never hides it.
	httpcaddyfile.RegisterDirectiveOrder("rate_limit_ui", httpcaddyfile.Before, "respond")
}

// UI is the http.handlers.rate_limit_ui module: the live page of the rate
// limit zones and its JSON, served by the site route it is placed in, so
// the site's own authentication (basic_auth, forward_auth) guards it. It
// answers, under the path it is given (for `rate_limit_ui /sluice/*`:
// /sluice/):
//
//	GET    <path>/  or  <path>/ui                        the page (its script: <path>/ui.js)
//	GET    <path>/zones, <path>/zones/<zone>, <path>/activity
//	GET    <path>/zones/<zone>/keys/<key>, .../tokens/<token>     a client's state
//	DELETE <path>/zones/<zone>/keys/<key>, .../tokens/<token>     reset it
//
// with the admin API's JSON (admin.go: the same code answers both). A
// request of any other method than GET, HEAD and OPTIONS is refused (403)
// unless it is same-origin: Sec-Fetch-Site, or where a browser sends none,
// Origin against Host (net/http's CrossOriginProtection), so another site
// cannot reset a key through a visitor's browser. It takes no options.
type UI struct{}

// CaddyModule returns the Caddy module information.
func (UI) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.rate_limit_ui",
		New: func() caddy.Module { return new(UI) },
	}
}

// UnmarshalCaddyfile parses `rate_limit_ui [<matcher>]` (the matcher is
// the directive helper's): no argument, no block.
func (*UI) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.Errf("rate_limit_ui takes no arguments (a path is its matcher: rate_limit_ui /sluice/*), got %q", d.Val())
	}
	if d.NextBlock(0) {
		return d.Errf("rate_limit_ui takes no options, got %q", d.Val())
	}
	return nil
}

func parseUICaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	u := new(UI)
	return u, u.UnmarshalCaddyfile(h.Dispenser)
}

// uiOrigin refuses the cross-origin requests of other methods than GET,
// HEAD and OPTIONS.
var uiOrigin = http.NewCrossOriginProtection()

// ServeHTTP answers the page and its JSON; it never calls next.
func (UI) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	var err error
	rest, ok := uiResource(r.URL.EscapedPath())
	switch {
	case uiOrigin.Check(r) != nil:
		err = apiErr(http.StatusForbidden, "refused: not a same-origin request (Sec-Fetch-Site or Origin); reset keys and set overrides from the live page itself, or with curl on the admin API")
	case !ok:
		err = apiErr(http.StatusNotFound, "not a page of the live page: it is at a path ending in / (for rate_limit_ui /sluice/*: /sluice/)")
	case rest == "ui":
		err = serveUIPage(w, r)
	case rest == "ui.js":
		err = serveUIScript(w, r)
	default:
		err = serveRateLimit(w, r, rest)
	}
	var ae caddy.APIError
	if errors.As(err, &ae) {
		// Answered as the admin API answers: JSON, for the page to show.
		return writeJSONStatus(w, ae.HTTPStatus, map[string]string{"error": ae.Err.Error()})
	}
	if err != nil {
		return caddyhttp.Error(http.StatusInternalServerError, err)
	}
	return nil
}

// uiResource maps an escaped request path to the resource it names,
// relative to the directive's path, read from its end: .../zones/<zone>/
// (keys|tokens)/<key>, .../zones/<zone>, .../zones, .../activity,
// .../ui.js, and the page at .../ui or any path ending in /.
func uiResource(p string) (string, bool) {
	s := strings.Split(p, "/")
	n := len(s)
	switch {
	case n >= 5 && s[n-4] == "zones" && (s[n-2] == "keys" || s[n-2] == "tokens" || s[n-2] == "overrides"):
		return strings.Join(s[n-4:], "/"), true
	case n >= 4 && s[n-3] == "zones" && s[n-1] == "overrides":
		return strings.Join(s[n-3:], "/"), true
	case n >= 3 && s[n-2] == "zones":
		return "zones/" + s[n-1], true
	}
	switch last := s[n-1]; last {
	case "", "ui":
		return "ui", true
	case "ui.js", "activity", "zones":
		return last, true
	}
	return "", false
}

// Interface guards.
var (
	_ caddyhttp.MiddlewareHandler = UI{}
	_ caddyfile.Unmarshaler       = (*UI)(nil)
)
