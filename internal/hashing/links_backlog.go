package hashing

// What the links count beside their tables: blocks whose verification was
// shed or waits, and the bytes every source's waiting verification holds.

// Shed is how many stored blocks ingest left unverified because their
// verification was waiting and its bound was reached (LinkScope.NoteShed):
// queries hash those blocks, as without links.
func (l *Links) Shed() uint64 {
	if l == nil {
		return 0
	}
	return l.shed.Load()
}

// NoteShed counts n stored blocks whose verification ingest gave up.
func (s LinkScope) NoteShed(n int) {
	if s.l != nil && n > 0 {
		s.l.shed.Add(uint64(n))
	}
}

// Pending is how many stored blocks wait for verification (NotePending),

// over all sources.
// SetBacklogLimit bounds, in bytes, what every source's verification
// backlog together may hold (TakeBacklog); 0, the default, leaves only
// each source's own bound. The links' part of the memory budget covers
// the backlog as well as the tables, and a bound per source alone grows
// with the number of sources.
func (l *Links) SetBacklogLimit(n int64) {
	if l != nil {
		l.backlogMax.Store(n)
	}
}

// TakeBacklog reserves n bytes of the shared backlog bound for a source's
// waiting verification, and reports false, reserving nothing, when they
// do not fit: the caller sheds what it would have kept (NoteShed).
func (l *Links) TakeBacklog(n int) bool {
	if l == nil {
		return true
	}
	limit := l.backlogMax.Load()
	for {
		cur := l.backlog.Load()
		if limit > 0 && cur+int64(n) > limit {
			return false
		}
		if l.backlog.CompareAndSwap(cur, cur+int64(n)) {
			return true
		}
	}
}

// GiveBacklog returns n bytes taken by TakeBacklog.
func (l *Links) GiveBacklog(n int) {
	if l != nil {
		l.backlog.Add(-int64(n))
	}
}

// BacklogBytes is what the sources' waiting verification holds now.
func (l *Links) BacklogBytes() int64 {
	if l == nil {
		return 0
	}
	return l.backlog.Load()
}

// Pending is how many stored blocks wait for verification (NotePending),
// over all sources.
func (l *Links) Pending() int64 {
	if l == nil {
		return 0
	}
	return l.pending.Load()
}

// NotePending adds delta to the blocks waiting for verification.
func (s LinkScope) NotePending(delta int) {
	if s.l != nil && delta != 0 {
		s.l.pending.Add(int64(delta))
	}
}
