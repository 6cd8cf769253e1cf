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

// indexSlab is a slab for an index under test: entry j holds key j.
type indexSlab []syncEntry

// add makes k's entry and returns its index.
func (s *indexSlab) add(k syncKey) uint32 {
	*s = append(*s, syncEntry{k: k})
	return uint32(len(*s) - 1)
}

// indexProbe is how far slot i is from its key's home slot.
func indexProbe(x *syncIndex, i int) int {
	mask := uint32(len(x.slots) - 1)
	return int((uint32(i) - x.slots[i].tag) & mask)
}

// checkIndex fails t unless x's count is right, every slot's tag is its
// key's, no key is held twice and every key is reachable (no empty slot
// between its home and its slot).
func checkIndex(t testing.TB, x *syncIndex, slab []syncEntry) {
	t.Helper()
	n := 0
	seen := map[syncKey]bool{}
	for i, s := range x.slots {
		if s.v == 0 {
			continue
		}
		n++
		k := slab[s.v-1].k
		if s.tag != indexTag(&k) {
			t.Fatalf("slot %d: tag %x, its key's is %x", i, s.tag, indexTag(&k))
		}
		if seen[k] {
			t.Fatalf("slot %d: key %v held twice", i, k)
		}
		seen[k] = true
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
func checkModel(t testing.TB, x *syncIndex, slab []syncEntry, m map[syncKey]uint32, space []syncKey) {
	t.Helper()
	for _, k := range space {
		v, ok := x.get(k, slab)
		if w, wok := m[k]; ok != wok || v != w {
			t.Fatalf("get(%v) = %d, %v; want %d, %v", k, v, ok, w, wok)
		}
	}
	got := map[syncKey]uint32{}
	for v := range x.each {
		k := slab[v].k
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
			binary.BigEndian.PutUint16(space[i].key[16:18], uint16(i)) // distinct keys
		}
		var x syncIndex
		var slab indexSlab
		m := map[syncKey]uint32{}
		for op := range 20 * size {
			k := space[r.IntN(size)]
			switch r.IntN(10) {
			case 0, 1, 2, 3, 4: // a new entry for k, held or not
				v := slab.add(k)
				x.put(k, v, slab)
				m[k] = v
			case 5, 6, 7:
				if v, ok := m[k]; ok || r.IntN(2) == 0 {
					x.del(k, v) // a key not held, half the time
				}
				delete(m, k)
			case 8:
				v, ok := x.get(k, slab)
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
				checkIndex(t, &x, slab)
			}
		}
		checkIndex(t, &x, slab)
		checkModel(t, &x, slab, m, space)
	}
}

// TestSyncIndexWrap deletes in runs that wrap around the table's end: the
// keys after a hole at slot 0 have their home at the end.
func TestSyncIndexWrap(t *testing.T) {
	var x syncIndex
	x.reset(0)
	mask := uint32(len(x.slots) - 1)
	// Keys whose home is one of the last two slots or the first.
	var keys []syncKey
	homes := map[uint32]int{}
	for n := uint32(0); len(keys) < 9; n++ {
		k := ipKey(7, n)
		h := indexTag(&k) & mask
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
		var slab indexSlab
		m := map[syncKey]uint32{}
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for _, k := range keys {
			m[k] = slab.add(k)
			x.put(k, m[k], slab)
		}
		if x.slots[0].v == 0 || x.slots[5].v == 0 {
			t.Fatalf("round %d: the run does not wrap (slots 0 and 5 empty)", round)
		}
		checkIndex(t, &x, slab)
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		for _, k := range keys {
			x.del(k, m[k])
			delete(m, k)
			checkIndex(t, &x, slab)
			checkModel(t, &x, slab, m, keys)
		}
	}
}

// TestSyncIndexTagCollision holds keys whose tags are equal (found among
// 400,000: about 19 pairs by the birthday bound): the key check tells them
// apart, in get, put and del.
func TestSyncIndexTagCollision(t *testing.T) {
	byTag := map[uint32]syncKey{}
	var pairs [][2]syncKey
	for n := range uint32(400_000) {
		k := ipKey(3, n)
		if o, ok := byTag[indexTag(&k)]; ok {
			pairs = append(pairs, [2]syncKey{o, k})
		}
		byTag[indexTag(&k)] = k
	}
	if len(pairs) == 0 {
		t.Fatal("no two of 400,000 keys share a tag")
	}
	var x syncIndex
	var slab indexSlab
	m := map[syncKey]uint32{}
	var space []syncKey
	for _, p := range pairs {
		for _, k := range p {
			m[k] = slab.add(k)
			x.put(k, m[k], slab)
			space = append(space, k)
		}
	}
	checkIndex(t, &x, slab)
	checkModel(t, &x, slab, m, space)
	for i, p := range pairs {
		k := p[i%2]
		x.del(k, uint32(len(slab))) // no entry's: nothing removed
		checkModel(t, &x, slab, m, space)
		m[k] = slab.add(k)
		x.put(k, m[k], slab)
		x.del(p[1-i%2], m[p[1-i%2]])
		delete(m, p[1-i%2])
	}
	checkIndex(t, &x, slab)
	checkModel(t, &x, slab, m, space)
	t.Logf("%d pairs of keys with one tag", len(pairs))
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
			slab := make([]syncEntry, live) // entry i holds key i, as a freed entry is reused
			next := uint32(0)
			for i := range slab {
				slab[i].k = ipKey(uint16(i%3), next)
				next++
				x.put(slab[i].k, uint32(i), slab)
			}
			size := len(x.slots)
			for range 1_000_000 {
				i := r.IntN(live)
				x.del(slab[i].k, uint32(i))
				slab[i].k = ipKey(uint16(r.IntN(3)), next)
				next++
				x.put(slab[i].k, uint32(i), slab)
			}
			if len(x.slots) != size || x.len() != live {
				t.Fatalf("after churn: %d slots, %d keys; want %d, %d", len(x.slots), x.len(), size, live)
			}
			checkIndex(t, &x, slab)
			sum, longest := indexProbes(&x)
			fresh := syncIndex{slots: make([]indexSlot, size)}
			for i := range slab {
				fresh.put(slab[i].k, uint32(i), slab)
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
	var slab indexSlab
	x.reset(2000)
	for i := range 1000 {
		k := ipKey(1, uint32(i))
		x.put(k, slab.add(k), slab)
	}
	in, out := ipKey(1, 500), ipKey(1, 5000)
	outV, n := slab.add(out), uint32(0)
	cases := map[string]func(){
		"get hit": func() { v, _ := x.get(in, slab); n += v },
		"get miss": func() {
			if _, ok := x.get(out, slab); ok {
				n++
			}
		},
		"put new, del": func() {
			x.put(out, outV, slab)
			x.del(out, outV)
		},
		"put update": func() { x.put(in, 500, slab) },
		"each, stopped": func() {
			seen := 0
			for v := range x.each {
				n += v
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
	var slab indexSlab
	for i := range 1000 {
		k := ipKey(2, uint32(i))
		x.put(k, slab.add(k), slab)
	}
	firsts := map[uint32]bool{}
	for range 50 {
		calls := 0
		x.each(func(v uint32) bool {
			if calls == 0 {
				firsts[v] = true
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
	var slab indexSlab
	for i := range 10_000 {
		k := ipKey(0, uint32(i))
		x.put(k, slab.add(k), slab)
	}
	big := len(x.slots)
	x.reset(9_000)
	if len(x.slots) != big || x.len() != 0 {
		t.Fatalf("reset(9000): %d slots, %d keys; want %d, 0", len(x.slots), x.len(), big)
	}
	checkModel(t, &x, slab, map[syncKey]uint32{}, []syncKey{ipKey(0, 1)})
	x.reset(100)
	if len(x.slots) >= big/4 {
		t.Fatalf("reset(100): %d slots kept", len(x.slots))
	}
	for i := range 100 {
		x.put(slab[i].k, uint32(i), slab)
	}
	if v, ok := x.get(ipKey(0, 99), slab); !ok || v != 99 {
		t.Fatalf("after reset: get = %d, %v", v, ok)
	}
}

// BenchmarkSyncIndexCold looks keys up in syncIndex and in the Go map it
// replaces, side by side, then reads the key's slab entry (its used
// field) as the request path does; the index's lookup reads the key there.
// Each lookup's key depends on the previous lookup's value (requests come
// one after another, not overlapped). cold: the keys in a random order,
// and before each lookup a write to one cache line of a 64 MB buffer,
// seven pages on from the last (Caddy's own work between two requests: a
// key's lines and pages are out of L1, L2 and the TLB when it comes again);
// "flush" is that write alone, to subtract. lookup: cold without the
// entry read. hot: 1,024 of the keys over and over.
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
			slab[i].k = keys[i]
			m[keys[i]] = uint32(i)
			x.put(keys[i], uint32(i), slab)
		}
		r.Shuffle(n, func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		gets := map[string]func(syncKey) uint32{
			"map":   func(k syncKey) uint32 { return m[k] },
			"index": func(k syncKey) uint32 { v, _ := x.get(k, slab); return v },
		}
		for _, mode := range []string{"cold", "lookup", "hot"} {
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
						if mode != "lookup" {
							v += uint32(slab[v].used)
						}
					}
				})
			}
		}
	}
}
