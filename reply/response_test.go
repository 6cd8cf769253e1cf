package reply

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/sluicehq/caddy-sluice/zonemodel"
)

// defaultBodyTemplate is the default refusal body as a body template:
// AppendDefaultBody must write what it renders to (for a zone name that
// needs no JSON escaping).
const defaultBodyTemplate = `{"status":{http.rate_limit.status},"error":"{http.rate_limit.error}","zone":"{http.rate_limit.zone}","retry_after":{http.rate_limit.retry_after}}`

// TestDefaultBodyIsTheTemplate: AppendDefaultBody writes what the
// defaultBodyTemplate renders to, for each status, message and a range of
// zone names and Retry-After values.
func TestDefaultBodyIsTheTemplate(t *testing.T) {
	for _, status := range []int{429, 503, 400, 599} {
		for _, msg := range []string{MsgExceeded, MsgUnavailable} {
			for _, zone := range []string{"z", "login", "api.v2-EU_1", strings.Repeat("x", zonemodel.MaxNameLen)} {
				for _, retry := range []int64{1, 9, 10, 99, 100, 3600, 86400, 1 << 40} {
					repl := caddy.NewReplacer()
					repl.Set("http.rate_limit.status", status)
					repl.Set("http.rate_limit.error", msg)
					repl.Set("http.rate_limit.zone", zone)
					repl.Set("http.rate_limit.retry_after", retry)
					want := repl.ReplaceKnown(defaultBodyTemplate, "")
					if got := string(AppendDefaultBody(nil, status, msg, zone, retry)); got != want {
						t.Fatalf("got  %s\nwant %s", got, want)
					}
				}
			}
		}
	}
}
