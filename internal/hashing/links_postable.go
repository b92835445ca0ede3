package hashing

import (
	"math/bits"
	"unsafe"
)

// posTable: the open-addressing tables a generation files its blocks in,
// by id and by key.

// posTable is an open-addressed map from a 64-bit key to a runPos, with
// linear probing at a load of at most 3/4: half the memory of a Go map
// and a fraction of its insert cost for these random keys. The zero
// slot (pos 0) is empty; positions are stored plus one.
//
// A table grows fourfold, and its last size is exactly what its
// generation's budget holds (linkGen.maxSlots), not a power of two: the
// slots are fresh memory, whose first touch (a page fault) costs more
// than filing a block, so a table makes and copies half of what doubling
// would, and ends at the size it needs. A key's home is its multiplied
// hash scaled to the table's size, so growing keeps the keys' order and
// the copy runs through both tables in sequence.
type posTable struct {
	slots []posSlot
	n     int
	// next, when set, is the zeroed memory grow moves the slots to
	// (Record prepares it outside the lock).
	next []posSlot
	// noNext is a size at which prepared slots did not fit the budget:
	// grow makes its own there.
	noNext int
}

// minSlots is a table's first size.
const minSlots = 1024

// faultIn touches every page of fresh slots, so that the page faults
// happen now rather than when they are filled.
func faultIn(s []posSlot) []posSlot {
	const perPage = 4096 / posSlotBytes
	for i := 0; i < len(s); i += perPage {
		s[i].pos = 0
	}
	return s
}

// nextLen is the size t grows to, within a generation whose tables end at
// maxSlots; past that (which the generation's budget does not let
// happen) it doubles.
func (t *posTable) nextLen(maxSlots int) int {
	n := len(t.slots)
	if n >= maxSlots {
		return max(2*n, minSlots)
	}
	return max(min(4*n, maxSlots), minSlots)
}

type posSlot struct {
	key uint64
	pos uint32
}

const posSlotBytes = int(unsafe.Sizeof(posSlot{}))

func (t *posTable) home(k uint64) int {
	hi, _ := bits.Mul64(k*0x9e3779b97f4a7c15, uint64(len(t.slots)))
	return int(hi)
}

func (t *posTable) get(k uint64) (runPos, bool) {
	if t.n == 0 {
		return 0, false
	}
	for i := t.home(k); ; {
		s := &t.slots[i]
		if s.pos == 0 {
			return 0, false
		}
		if s.key == k {
			return runPos(s.pos - 1), true
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// put files p under k, replacing what k had, and reports whether k is new.
// A table at 3/4 grows first, to nextLen(maxSlots).
func (t *posTable) put(k uint64, p runPos, maxSlots int) bool {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow(t.nextLen(maxSlots))
	}
	i := t.home(k)
	for t.slots[i].pos != 0 {
		if t.slots[i].key == k {
			t.slots[i].pos = uint32(p) + 1
			return false
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
	t.slots[i] = posSlot{key: k, pos: uint32(p) + 1}
	t.n++
	return true
}

// grow moves the slots into a table of n (next when it was prepared at
// that size).
func (t *posTable) grow(n int) {
	old := t.slots
	if len(t.next) == n {
		t.slots, t.next = t.next, nil
	} else {
		t.slots, t.next = make([]posSlot, n), nil
	}
	for _, s := range old {
		if s.pos == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].pos != 0 {
			if i++; i == len(t.slots) {
				i = 0
			}
		}
		t.slots[i] = s
	}
}
