package admin

import (
	"sync"
	"testing"

	"github.com/sluicehq/caddy-sluice/identity"
)

// TestRecentKeysOnce: a key refused from many goroutines is one entry with
// every refusal counted; a new key past the table's size replaces the one
// refused longest ago.
func TestRecentKeysOnce(t *testing.T) {
	var a ZoneActivity
	tok := func(i int) identity.Token { var k identity.Token; k[0], k[1] = 0x41, byte(i); return k }
	const workers, each = 8, 250
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				a.Remember(tok(0), int64(1000+i), 1, false, w%2 == 0)
			}
		})
	}
	wg.Wait()
	if got := a.last(); len(got) != 1 || got[0].count != workers*each {
		t.Fatalf("one key refused %d times: %d entries, first %+v; want 1 entry counting %d", workers*each, len(got), got, workers*each)
	}
	for i := 1; i <= recentKeys; i++ { // key 0 (last refused at 1249) is now the oldest
		a.Remember(tok(i), int64(2000+i), 1, false, false)
	}
	got := a.last()
	if len(got) != recentKeys {
		t.Fatalf("%d entries, want %d", len(got), recentKeys)
	}
	for j, k := range got {
		if k.token == tok(0) {
			t.Errorf("the key refused longest ago is still remembered")
		}
		if want := tok(recentKeys - j); k.token != want || k.count != 1 {
			t.Errorf("entry %d: %s ×%d, want %s ×1 (newest first)", j, k.token, k.count, want)
		}
	}
}
