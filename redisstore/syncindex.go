package redisstore

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
)

// syncIndex maps a key to its entry's index in its shard's slab: an
// open-addressing table with linear probing of 8-byte slots (a hash tag
// and the index), whose key check reads the slab entry that the request
// reads next anyway. A cold lookup costs one line of a table a third the
// size of one holding the keys (a Go map: its control word's line, then
// its slot's). It holds no pointer (the garbage collector never scans
// it), grows past a load of 3/4 and deletes by shifting back the keys after
// the removed one (no tombstones: churn never lengthens the probes). The
// hash is seeded per process, as clients choose the keys. Not safe for
// concurrent use; the zero value is an empty index.
type syncIndex struct {
	slots []indexSlot // len a power of two, or 0
	n     int         // keys held
}

// indexSlot is a key's hash tag, whose low bits are its home slot, and
// its slab index plus one: v == 0 is an empty slot.
type indexSlot struct {
	tag, v uint32
}

const (
	indexMinSlots = 16
	// indexMaxLoad is the load a put may reach, in 1/8ths.
	indexMaxLoad = 6
)

// indexSeed keys the hash, per process.
var indexSeed = [4]uint64{rand.Uint64(), rand.Uint64(), rand.Uint64(), rand.Uint64()}

// indexTag hashes k's 20 bytes (three loads; wyhash's folded product).
func indexTag(k *syncKey) uint32 {
	a := binary.LittleEndian.Uint64(k.key[0:8])
	b := binary.LittleEndian.Uint64(k.key[8:16])
	c := uint64(binary.LittleEndian.Uint16(k.key[16:18])) | uint64(k.zone)<<16
	hi, lo := bits.Mul64(a^indexSeed[0], b^indexSeed[1])
	hi, lo = bits.Mul64(hi^lo^indexSeed[2], c^indexSeed[3])
	return uint32(hi ^ lo)
}

// get returns the index of k's entry in slab, if held.
func (x *syncIndex) get(k syncKey, slab []syncEntry) (uint32, bool) {
	if x.n == 0 {
		return 0, false
	}
	t := indexTag(&k)
	mask := uint32(len(x.slots) - 1)
	for i := t & mask; ; i = (i + 1) & mask {
		s := x.slots[i]
		if s.v == 0 {
			return 0, false
		}
		if s.tag == t && slab[s.v-1].k == k {
			return s.v - 1, true
		}
	}
}

// put makes v (< math.MaxUint32) k's entry index; slab[v].k must be k
// already. A k held is moved to v.
func (x *syncIndex) put(k syncKey, v uint32, slab []syncEntry) {
	if (x.n+1)*8 > len(x.slots)*indexMaxLoad {
		x.resize(max(2*len(x.slots), indexMinSlots))
	}
	t := indexTag(&k)
	mask := uint32(len(x.slots) - 1)
	for i := t & mask; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.v == 0 {
			*s = indexSlot{tag: t, v: v + 1}
			x.n++
			return
		}
		if s.tag == t && slab[s.v-1].k == k {
			s.v = v + 1
			return
		}
	}
}

// del removes k, held as entry v, if so, moving back the keys of its run
// that can take the hole (backward-shift deletion).
func (x *syncIndex) del(k syncKey, v uint32) {
	if x.n == 0 {
		return
	}
	t := indexTag(&k)
	mask := uint32(len(x.slots) - 1)
	i := t & mask
	for ; x.slots[i] != (indexSlot{tag: t, v: v + 1}); i = (i + 1) & mask {
		if x.slots[i].v == 0 {
			return
		}
	}
	// i is the hole. A key further in the run moves into it when the hole
	// is on its probe path (its home is not after the hole); its slot is
	// the new hole.
	for j := (i + 1) & mask; x.slots[j].v != 0; j = (j + 1) & mask {
		if (j-x.slots[j].tag)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = indexSlot{}
	x.n--
}

func (x *syncIndex) len() int { return x.n }

// each calls yield with the entry index of every key held, starting at a
// random slot (eviction samples the first ones), until yield returns
// false; it is an iter.Seq. yield must not put or del.
func (x *syncIndex) each(yield func(v uint32) bool) {
	if x.n == 0 {
		return
	}
	mask := uint32(len(x.slots) - 1)
	start := rand.Uint32() & mask
	for o := range uint32(len(x.slots)) {
		if s := x.slots[(start+o)&mask]; s.v != 0 && !yield(s.v-1) {
			return
		}
	}
}

// reset empties the index for about hint keys: it keeps its memory unless
// that is too small for them or over four times what they need.
func (x *syncIndex) reset(hint int) {
	want := indexMinSlots
	for hint*8 > want*indexMaxLoad {
		want *= 2
	}
	x.n = 0
	if len(x.slots) < want || len(x.slots) > 4*want {
		x.slots = make([]indexSlot, want)
		return
	}
	clear(x.slots)
}

// resize moves the keys to a table of size slots (a power of two that
// holds them); a slot's tag gives its home, so no key is read.
func (x *syncIndex) resize(size int) {
	old := x.slots
	x.slots = make([]indexSlot, size)
	mask := uint32(size - 1)
	for _, s := range old {
		if s.v == 0 {
			continue
		}
		i := s.tag & mask
		for x.slots[i].v != 0 {
			i = (i + 1) & mask
		}
		x.slots[i] = s
	}
}
