package index

// A Version names the state of a table as queries see it: its registration
// snapshot and how many writers have changed its stripes. Two equal
// Versions of one table mean that no owner was registered or removed and no
// stripe was written in between, so a walk of any chain gives the same
// answer at both; that is what lets the query engine reuse an answer
// without walking again (docs/architecture.md, "Answer reuse").
//
// The proof rests on two rules every writer keeps: it changes a stripe only
// under the stripe's write lock, and it counts itself in the stripe's gen
// (Table.changing) after taking the lock and before its first change.
// Each gen only grows, so their sum is unchanged exactly when each of them
// is. See QueryVersioned for why an answer computed between two equal sums
// is the answer at that Version.
type Version struct {
	view *ownerView
	gen  uint64
}

// changing is what a writer calls, holding s's write lock, before its first
// change to s: it counts the writer in s.gen, so versions taken before and
// after differ, and copies s for a cut in progress (cow).
func (t *Table) changing(s *stripe) {
	s.gen.Add(1)
	t.cow(s)
}

// gens is the sum of the stripes' writer counts.
func (t *Table) gens() uint64 {
	var n uint64
	for i := range t.stripes {
		n += t.stripes[i].gen.Load()
	}
	return n
}

// Version returns the table's current version. It takes no lock and costs
// one load per stripe.
func (t *Table) Version() Version {
	// Order does not matter: both parts are compared, and either changes
	// with any registration change or stripe write.
	v := t.view.Load()
	return Version{view: v, gen: t.gens()}
}

// QueryVersioned is Query that also returns the version its answer belongs
// to, with exact reporting whether no writer changed the table during the
// walk; only then is the answer the one any later walk at that version
// would give.
//
// Why: let the stripes' counts sum to g before the walk and again to g
// after it. No writer counted itself in between. A writer counted before
// took its stripe's lock before the count was read, so the walk's read
// lock on that stripe waited for it and saw its change; a writer counted
// later takes the lock after the walk's last read of it and changes
// nothing the walk saw. So the walk read, stripe by stripe, exactly the
// changes of the writers counted in g, and the snapshot it mapped owners
// with is the version's.
func (t *Table) QueryVersioned(chain Chain, instance string, res *QueryResult) (ver Version, exact bool) {
	ver = t.Version()
	t.query(ver.view, chain, instance, res)
	return ver, t.gens() == ver.gen
}
