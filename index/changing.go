package index

// changing is what a writer calls, holding s's write lock, before its first
// change to s: it copies s for a cut in progress (cow). Every path that
// changes what a query can see goes through it, so a cut never misses a
// change (TestCutSeesEveryWriter).
func (t *Table) changing(s *stripe) {
	t.cow(s)
}
