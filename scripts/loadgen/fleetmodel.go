package main

// The fleet preset's answer model (--fleet-rounds, issue 43). Every
// publisher holds a fixed set of slots, one prompt each (its placements of
// the corpus), and replaces them in order, oldest first, one message per
// prompt: BlockRemoved of the old prompt's private blocks, then BlockStored
// of the new prompt's. A slot keeps its group, so the group's system
// prompt stays held by the publisher throughout (an engine keeps a shared
// block while any request references it) and only private blocks move.
//
// A publisher's messages are applied in order, so its state is one number,
// how many of its replacement messages the server has applied: message m
// (1-based) replaces slot (m-1) mod S by its round (m-1)/S + 1. The model
// keeps two counters per publisher: sent, raised before a message leaves
// the socket, and applied, raised only once the server showed the effect
// (a query saw the new prompt whole, or the server's applied-events
// counter covered the round and a query confirmed its last message). A
// query that ran between marks applied(t0) and sent(t1) was answered from
// a state in between, and what the answer may be follows from the slot's
// versions over that span.

// fleetSlots is what the model knows of one publisher's slots.
type fleetSlots struct {
	n     int   // slots (prompts held)
	group []int // each slot's group, fixed across rounds
}

// version is the round of the prompt slot j holds after a messages.
func (s *fleetSlots) version(a int64, j int) int {
	v := int(a / int64(s.n))
	if int64(j) < a%int64(s.n) {
		v++
	}
	return v
}

// message is the 1-based index of the message that brings slot j to
// round r (r >= 1).
func (s *fleetSlots) message(j, r int) int64 {
	return int64(r-1)*int64(s.n) + int64(j) + 1
}

// fleetBounds is the range, in blocks, an answer's longest match for the
// publisher that owns slot j may take when the query asked for the slot's
// round-r prompt and ran while the publisher's applied count was at least
// applied (when it was sent) and its sent count at most sent (when the
// answer arrived). full is the prompt's blocks and sys its system
// prompt's, which the slot's publisher holds throughout.
//
// Stable versions answer full when they hold round r and sys otherwise; a
// version change in flight (a removal or a store applied part-way) gives
// anything between, so the bounds are exact when the slot did not move and
// [sys, full] when round r was held at one end of the span.
func (s *fleetSlots) bounds(j, r int, applied, sent int64, sys, full int) (lo, hi int) {
	v0, v1 := s.version(applied, j), s.version(sent, j)
	lo, hi = sys, sys
	if v0 <= r && r <= v1 {
		hi = full
	}
	if v0 == v1 && v0 == r {
		lo = full
	}
	return lo, hi
}

// fleetVerdict is how one answer's entry compares with its bounds.
type fleetVerdict uint8

const (
	verdictExact fleetVerdict = iota // within bounds that were exact
	verdictRange                     // within bounds that were a range
	verdictAbove                     // above the upper bound: never allowed
	verdictBelow                     // below the lower bound: information lost
)

// judge compares an answer's longest match (tokens) with bounds in blocks
// of bs tokens.
func judge(got int64, lo, hi, bs int) fleetVerdict {
	switch {
	case got > int64(hi*bs):
		return verdictAbove
	case got < int64(lo*bs):
		return verdictBelow
	case lo == hi:
		return verdictExact
	}
	return verdictRange
}
