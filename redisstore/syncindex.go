package redisstore

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
)

// syncIndex maps a syncKey to a uint32 (an index in its shard's slab): an
// open-addressing table with linear probing, whose slot holds the key
// inline, so that a present key costs one cache line in the common case
// (a Go map reads its control word, then the slot, then the value). It
// holds no pointer (the garbage collector never scans it), grows past a
// load of 3/4 and deletes by shifting back the keys after the removed one
// (no tombstones: churn never lengthens the probes). The hash is seeded
// per process, as keys are chosen by clients. Not safe for concurrent use;
// the zero value is an empty index.
type syncIndex struct {
	slots []indexSlot // len a power of two, or 0
	n     int         // keys held
}

// indexSlot is a key in the form the hash reads (syncKey's 20 bytes as
// three words) and its value plus one: v == 0 is an empty slot.
type indexSlot struct {
	v, c uint32
	a, b uint64
}

const (
	indexMinSlots = 16
	// indexMaxLoad is the load a put may reach, in 1/8ths.
	indexMaxLoad = 6
)

// indexSeed keys the hash, per process.
var indexSeed = [4]uint64{rand.Uint64(), rand.Uint64(), rand.Uint64(), rand.Uint64()}

// indexWords returns k as the words a slot holds.
func indexWords(k *syncKey) (a, b uint64, c uint32) {
	return binary.LittleEndian.Uint64(k.key[0:8]), binary.LittleEndian.Uint64(k.key[8:16]),
		uint32(binary.LittleEndian.Uint16(k.key[16:18])) | uint32(k.zone)<<16
}

// indexMix is the 128-bit product of x and y, folded (wyhash's mum).
func indexMix(x, y uint64) uint64 {
	hi, lo := bits.Mul64(x, y)
	return hi ^ lo
}

func indexHash(a, b uint64, c uint32) uint64 {
	h := indexMix(a^indexSeed[0], b^indexSeed[1])
	return indexMix(h^indexSeed[2], uint64(c)^indexSeed[3])
}

// get returns k's value, if held.
func (x *syncIndex) get(k syncKey) (uint32, bool) {
	if x.n == 0 {
		return 0, false
	}
	a, b, c := indexWords(&k)
	mask := uint64(len(x.slots) - 1)
	for i := indexHash(a, b, c) & mask; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.v == 0 {
			return 0, false
		}
		if s.a == a && s.b == b && s.c == c {
			return s.v - 1, true
		}
	}
}

// put sets k's value to v (v < math.MaxUint32: a slab index).
func (x *syncIndex) put(k syncKey, v uint32) {
	if (x.n+1)*8 > len(x.slots)*indexMaxLoad {
		x.resize(max(2*len(x.slots), indexMinSlots))
	}
	a, b, c := indexWords(&k)
	mask := uint64(len(x.slots) - 1)
	for i := indexHash(a, b, c) & mask; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.v == 0 {
			*s = indexSlot{v: v + 1, c: c, a: a, b: b}
			x.n++
			return
		}
		if s.a == a && s.b == b && s.c == c {
			s.v = v + 1
			return
		}
	}
}

// del removes k, if held, moving back the keys of its run that can take
// the hole (backward-shift deletion).
func (x *syncIndex) del(k syncKey) {
	if x.n == 0 {
		return
	}
	a, b, c := indexWords(&k)
	mask := uint64(len(x.slots) - 1)
	i := indexHash(a, b, c) & mask
	for {
		s := &x.slots[i]
		if s.v == 0 {
			return
		}
		if s.a == a && s.b == b && s.c == c {
			break
		}
		i = (i + 1) & mask
	}
	// i is the hole. A key further in the run moves into it when the hole
	// is on its probe path (its home is not after the hole); its slot is
	// the new hole.
	for j := (i + 1) & mask; x.slots[j].v != 0; j = (j + 1) & mask {
		s := &x.slots[j]
		if (j-indexHash(s.a, s.b, s.c))&mask >= (j-i)&mask {
			x.slots[i] = *s
			i = j
		}
	}
	x.slots[i] = indexSlot{}
	x.n--
}

func (x *syncIndex) len() int { return x.n }

// each calls yield with every key held and its value, starting at a random
// slot (eviction samples its first keys), until yield returns false; it
// is an iter.Seq2. yield must not put or del.
func (x *syncIndex) each(yield func(k syncKey, v uint32) bool) {
	if x.n == 0 {
		return
	}
	mask := uint64(len(x.slots) - 1)
	start := rand.Uint64() & mask
	for o := range uint64(len(x.slots)) {
		s := &x.slots[(start+o)&mask]
		if s.v == 0 {
			continue
		}
		var k syncKey
		binary.LittleEndian.PutUint64(k.key[0:8], s.a)
		binary.LittleEndian.PutUint64(k.key[8:16], s.b)
		binary.LittleEndian.PutUint16(k.key[16:18], uint16(s.c))
		k.zone = uint16(s.c >> 16)
		if !yield(k, s.v-1) {
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
// holds them).
func (x *syncIndex) resize(size int) {
	old := x.slots
	x.slots = make([]indexSlot, size)
	mask := uint64(size - 1)
	for _, s := range old {
		if s.v == 0 {
			continue
		}
		i := indexHash(s.a, s.b, s.c) & mask
		for x.slots[i].v != 0 {
			i = (i + 1) & mask
		}
		x.slots[i] = s
	}
}
