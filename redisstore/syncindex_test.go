package redisstore

import (
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/sluicehq/caddy-sluice/algorithms"
)

// ipKey is the key of a masked IPv4 address n in zone (identity's layout):
// keys that differ in a few bytes only, as clients make them.
func ipKey(zone uint16, n uint32) syncKey {
	k := syncKey{zone: zone}
	k.key[0], k.key[1] = 1, byte(algorithms.KeyIPv4)
	binary.BigEndian.PutUint32(k.key[2:6], n)
	return k
}

// indexProbe is how far slot i is from its key's home slot.
func indexProbe(x *syncIndex, i int) int {
	s := x.slots[i]
	mask := uint64(len(x.slots) - 1)
	return int((uint64(i) - indexHash(s.a, s.b, s.c)) & mask)
}

// checkIndex fails t unless x's count is right, no key is held twice and
// every key is reachable (no empty slot between its home and its slot).
func checkIndex(t testing.TB, x *syncIndex) {
	t.Helper()
	n := 0
	seen := map[indexSlot]bool{}
	for i, s := range x.slots {
		if s.v == 0 {
			continue
		}
		n++
		if k := (indexSlot{a: s.a, b: s.b, c: s.c}); seen[k] {
			t.Fatalf("slot %d: key held twice", i)
		} else {
			seen[k] = true
		}
		for d := indexProbe(x, i); d > 0; d-- {
			if x.slots[(i-d)&(len(x.slots)-1)].v == 0 {
				t.Fatalf("slot %d: an empty slot %d before it on its probe path", i, d)
			}
		}
	}
	if n != x.len() {
		t.Fatalf("len() = %d, slots hold %d", x.len(), n)
	}
}

// checkModel fails t unless x holds exactly m (get, len and a whole each).
func checkModel(t testing.TB, x *syncIndex, m map[syncKey]uint32, space []syncKey) {
	t.Helper()
	for _, k := range space {
		v, ok := x.get(k)
		if w, wok := m[k]; ok != wok || v != w {
			t.Fatalf("get(%v) = %d, %v; want %d, %v", k, v, ok, w, wok)
		}
	}
	got := map[syncKey]uint32{}
	for k, v := range x.each {
		if _, dup := got[k]; dup {
			t.Fatalf("each yields %v twice", k)
		}
		got[k] = v
	}
	if len(got) != len(m) || x.len() != len(m) {
		t.Fatalf("each yields %d keys, len() = %d; want %d", len(got), x.len(), len(m))
	}
	for k, v := range m {
		if w, ok := got[k]; !ok || w != v {
			t.Fatalf("each: %v = %d, %v; want %d", k, w, ok, v)
		}
	}
}

func TestSyncIndexModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 20 {
		// Small key spaces collide and update often; larger ones grow.
		size := []int{8, 50, 700, 5000}[round%4]
		space := make([]syncKey, size)
		for i := range space {
			space[i] = ipKey(uint16(r.IntN(3)), r.Uint32N(uint32(4*size)))
			space[i].key[17] = byte(i) // distinct keys
			space[i].key[16] = byte(i >> 8)
		}
		var x syncIndex
		m := map[syncKey]uint32{}
		for op := range 20 * size {
			k := space[r.IntN(size)]
			switch r.IntN(10) {
			case 0, 1, 2, 3, 4:
				v := r.Uint32N(1 << 31)
				x.put(k, v)
				m[k] = v
			case 5, 6, 7:
				x.del(k)
				delete(m, k)
			case 8:
				v, ok := x.get(k)
				if w, wok := m[k]; ok != wok || v != w {
					t.Fatalf("round %d op %d: get = %d, %v; want %d, %v", round, op, v, ok, w, wok)
				}
			case 9:
				if r.IntN(size) == 0 {
					x.reset(r.IntN(2 * size))
					clear(m)
				}
			}
			if op%(size/2+1) == 0 {
				checkIndex(t, &x)
			}
		}
		checkIndex(t, &x)
		checkModel(t, &x, m, space)
	}
}

// TestSyncIndexWrap deletes in runs that wrap around the table's end: the
// keys after a hole at slot 0 have their home at the end.
func TestSyncIndexWrap(t *testing.T) {
	var x syncIndex
	x.reset(0)
	mask := uint64(len(x.slots) - 1)
	// Keys whose home is one of the last two slots or the first.
	var keys []syncKey
	homes := map[uint64]int{}
	for n := uint32(0); len(keys) < 9; n++ {
		k := ipKey(7, n)
		a, b, c := indexWords(&k)
		h := indexHash(a, b, c) & mask
		if (h == mask-1 || h == mask || h == 0) && homes[h] < 3 {
			homes[h]++
			keys = append(keys, k)
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		x.reset(0)
		if len(x.slots) != int(mask+1) {
			t.Fatalf("reset(0) made %d slots, want %d", len(x.slots), mask+1)
		}
		m := map[syncKey]uint32{}
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for i, k := range keys {
			x.put(k, uint32(i))
			m[k] = uint32(i)
		}
		if x.slots[0].v == 0 || x.slots[5].v == 0 {
			t.Fatalf("round %d: the run does not wrap (slots 0 and 5 empty)", round)
		}
		checkIndex(t, &x)
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for _, k := range keys {
			x.del(k)
			delete(m, k)
			checkIndex(t, &x)
			checkModel(t, &x, m, keys)
		}
	}
}

// indexProbes returns the sum and the longest of x's keys' distances from
// their home slots.
func indexProbes(x *syncIndex) (sum, longest int) {
	for i := range x.slots {
		if x.slots[i].v != 0 {
			d := indexProbe(x, i)
			sum += d
			longest = max(longest, d)
		}
	}
	return sum, longest
}

// TestSyncIndexChurn replaces keys a million times (as max_keys and the
// sweep do, forever) and checks that lookups stay as short as in a table
// built afresh with the keys then held.
func TestSyncIndexChurn(t *testing.T) {
	for _, live := range []int{100_000, 98_304} { // 98,304: the table at its 3/4 load
		t.Run(strconv.Itoa(live), func(t *testing.T) {
			r := rand.New(rand.NewPCG(5, uint64(live)))
			var x syncIndex
			keys := make([]syncKey, live)
			next := uint32(0)
			for i := range keys {
				keys[i] = ipKey(uint16(i%3), next)
				next++
				x.put(keys[i], uint32(i))
			}
			size := len(x.slots)
			for range 1_000_000 {
				i := r.IntN(live)
				x.del(keys[i])
				keys[i] = ipKey(uint16(r.IntN(3)), next)
				next++
				x.put(keys[i], uint32(i))
			}
			if len(x.slots) != size || x.len() != live {
				t.Fatalf("after churn: %d slots, %d keys; want %d, %d", len(x.slots), x.len(), size, live)
			}
			checkIndex(t, &x)
			sum, longest := indexProbes(&x)
			fresh := syncIndex{slots: make([]indexSlot, size)}
			for i, k := range keys {
				fresh.put(k, uint32(i))
			}
			fsum, flongest := indexProbes(&fresh)
			// Linear probing's total displacement depends on the keys
			// held, not on the order of the operations that led there.
			if sum != fsum {
				t.Errorf("total probe distance %d after churn, %d built afresh", sum, fsum)
			}
			// Knuth: a hit at load α probes (1+1/(1-α))/2 slots on average.
			alpha := float64(live) / float64(size)
			avg, bound := 1+float64(sum)/float64(live), 1.5*(1+1/(1-alpha))/2
			if avg > bound || longest > 2*flongest+16 {
				t.Errorf("load %.3f: %.2f slots probed on average (bound %.2f), longest distance %d (afresh %d)",
					alpha, avg, bound, longest, flongest)
			}
			t.Logf("load %.3f: %.2f slots probed on average, longest distance %d (afresh %d)", alpha, avg, longest, flongest)
		})
	}
}

func TestSyncIndexAllocs(t *testing.T) {
	var x syncIndex
	x.reset(2000)
	for i := range 1000 {
		x.put(ipKey(1, uint32(i)), uint32(i))
	}
	in, out, n := ipKey(1, 500), ipKey(1, 5000), uint32(0)
	cases := map[string]func(){
		"get hit": func() { v, _ := x.get(in); n += v },
		"get miss": func() {
			if _, ok := x.get(out); ok {
				n++
			}
		},
		"put new, del": func() {
			x.put(out, 1)
			x.del(out)
		},
		"put update": func() { x.put(in, 500) },
		"each, stopped": func() {
			seen := 0
			for k := range x.each {
				n += uint32(k.zone)
				if seen++; seen == 8 {
					break
				}
			}
		},
		"reset keeping": func() { x.reset(1000) },
	}
	for name, f := range cases {
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s: %.1f allocations", name, a)
		}
	}
}

func TestSyncIndexEach(t *testing.T) {
	var x syncIndex
	for i := range 1000 {
		x.put(ipKey(2, uint32(i)), uint32(i))
	}
	firsts := map[syncKey]bool{}
	for range 50 {
		calls := 0
		x.each(func(k syncKey, _ uint32) bool {
			if calls == 0 {
				firsts[k] = true
			}
			calls++
			return calls < 3
		})
		if calls != 3 {
			t.Fatalf("each called yield %d times after it returned false at 3", calls)
		}
	}
	// 50 starts among 1,000 keys: a fixed start gives one first key.
	if len(firsts) < 20 {
		t.Errorf("each started at %d distinct keys in 50 walks", len(firsts))
	}
}

// TestSyncIndexReset checks that reset empties the index, keeps its memory
// for a like number of keys and shrinks for far fewer.
func TestSyncIndexReset(t *testing.T) {
	var x syncIndex
	for i := range 10_000 {
		x.put(ipKey(0, uint32(i)), uint32(i))
	}
	big := len(x.slots)
	x.reset(9_000)
	if len(x.slots) != big || x.len() != 0 {
		t.Fatalf("reset(9000): %d slots, %d keys; want %d, 0", len(x.slots), x.len(), big)
	}
	if _, ok := x.get(ipKey(0, 1)); ok {
		t.Fatal("reset kept a key")
	}
	checkModel(t, &x, map[syncKey]uint32{}, []syncKey{ipKey(0, 1)})
	x.reset(100)
	if len(x.slots) >= big/4 {
		t.Fatalf("reset(100): %d slots kept", len(x.slots))
	}
	for i := range 100 {
		x.put(ipKey(0, uint32(i)), uint32(i))
	}
	if v, ok := x.get(ipKey(0, 99)); !ok || v != 99 {
		t.Fatalf("after reset: get = %d, %v", v, ok)
	}
}

// BenchmarkSyncIndexCold looks keys up in syncIndex and in the Go map it
// replaces, side by side. Each lookup's key depends on the previous
// lookup's value (requests come one after another, not overlapped).
// cold: the keys in a random order, and before each lookup a write to one
// cache line of a 64 MB buffer, seven pages on from the last (Caddy's own
// work between two requests: a key's lines and page are out of L1, L2 and
// the TLB when it comes again); "flush" is that write alone, to subtract.
// entry: cold, then the key's slab entry read, as the request path does.
// hot: 1,024 of the keys over and over.
func BenchmarkSyncIndexCold(b *testing.B) {
	flush := make([]byte, 64<<20)
	for _, n := range []int{100_000, 1_000_000} {
		r := rand.New(rand.NewPCG(7, uint64(n)))
		keys := make([]syncKey, n)
		slab := make([]syncEntry, n)
		m := make(map[syncKey]uint32)
		var x syncIndex
		for i := range keys {
			keys[i] = ipKey(uint16(i%3), r.Uint32())
			m[keys[i]] = uint32(i)
			x.put(keys[i], uint32(i))
		}
		r.Shuffle(n, func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		gets := map[string]func(syncKey) uint32{
			"map":   func(k syncKey) uint32 { return m[k] },
			"index": func(k syncKey) uint32 { v, _ := x.get(k); return v },
		}
		for _, mode := range []string{"cold", "entry", "hot"} {
			span := n
			if mode == "hot" {
				span = 1024
			}
			for _, impl := range []string{"flush", "map", "index"} {
				if impl == "flush" && mode != "cold" {
					continue
				}
				get := gets[impl]
				b.Run(strconv.Itoa(n)+"/"+mode+"/"+impl, func(b *testing.B) {
					i, f, v := 0, 0, uint32(0)
					for b.Loop() {
						// v < 2^31: i moves on, after the lookup.
						if i += 1 + int(v>>31); i >= span {
							i = 0
						}
						if mode != "hot" {
							flush[f]++
							if f += 7*4096 + 64; f >= len(flush) {
								f -= len(flush)
							}
						}
						if get == nil {
							continue
						}
						v = get(keys[i])
						if mode == "entry" {
							v += uint32(slab[v].used)
						}
					}
				})
			}
		}
	}
}
