package redisstore

import (
	"testing"
	"time"

	"github.com/sluicehq/caddy-sluice/algorithms"
	"github.com/sluicehq/caddy-sluice/internal/redistest"
)

// A report-only zone never vetoes and is charged exactly as under
// enforcement, in Redis as in memory: charged when the request passes and it
// allows itself, never for a would-be refusal, never when an enforcing zone
// refuses.
func TestReportOnlyInRedis(t *testing.T) {
	srv := redistest.Start(t)
	s := newTestStore(t, srv.URL(), "", time.Second, 0)
	key := freshKey(t)
	tight := algorithms.Request{Zone: "ro_tight", Key: key, Limit: limit(t, 1, time.Hour, 0), Cost: 1, ReportOnly: true}
	enforced := algorithms.Request{Zone: "ro_enf", Key: key, Limit: limit(t, 3, time.Hour, 0), Cost: 1}
	for i := 0; i < 3; i++ {
		d := take(t, s, tight, enforced)
		if !d[1].Allowed || d[1].Remaining != int64(2-i) {
			t.Fatalf("request %d: enforced zone %+v", i+1, d[1])
		}
		if d[0].Allowed != (i == 0) || d[0].Remaining != 0 {
			t.Fatalf("request %d: report-only zone %+v", i+1, d[0])
		}
	}
	tightKey := s.Key(tight.Zone, key)
	before := getRaw(t, srv.Client(), tightKey)
	d := take(t, s, tight, enforced)
	if d[1].Allowed {
		t.Fatalf("the enforced zone must refuse: %+v", d[1])
	}
	if after := getRaw(t, srv.Client(), tightKey); after != before {
		t.Fatalf("a refused request changed the report-only zone's state: %q -> %q", before, after)
	}
	// Alone, a report-only zone that would refuse is not charged either.
	other := tight
	other.Key = freshKey(t)
	take(t, s, other)
	st := getRaw(t, srv.Client(), s.Key(other.Zone, other.Key))
	if d := take(t, s, other); d[0].Allowed {
		t.Fatalf("second request on a 1-event report-only zone: %+v", d[0])
	}
	if got := getRaw(t, srv.Client(), s.Key(other.Zone, other.Key)); got != st {
		t.Fatalf("a would-be refusal charged the report-only zone: %q -> %q", st, got)
	}
}
