package durable

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/mooncake-conductor-go/conductor/internal/bearer"
	"github.com/mooncake-conductor-go/conductor/internal/state/snapshot"
)

// DefaultPeerTimeout bounds one peer's snapshot transfer: a peer slower
// than this is given up for the next one.
const DefaultPeerTimeout = 60 * time.Second

// maxPeerSnapshot bounds what is read from a peer (the index's largest
// snapshots are hundreds of MiB; this refuses a runaway stream).
const maxPeerSnapshot = 8 << 30

// SnapshotPath is the route peers serve their snapshot on.
const SnapshotPath = "/snapshot"

// bootstrap loads the first peer snapshot that arrives whole and reads
// back cleanly into the restore plan, and reports whether one did. A
// slow, dying or corrupt peer is logged and the next one tried; nothing of
// a failed transfer is used, since a snapshot is decoded and checked whole
// before any of it is.
func (s *State) bootstrap() bool {
	for _, peer := range s.opts.Peers {
		t0 := time.Now()
		snap, n, err := s.fetch(peer)
		if err != nil {
			s.log.Warn().Str("peer", peer).Err(err).Msg("no usable snapshot from peer; trying the next source")
			continue
		}
		s.plan = newPlan(snap)
		s.plan.fromPeer = true
		s.stats.restoreStart = t0
		s.log.Info().Str("peer", peer).Time("created", snap.Created).Int64("bytes", n).Int("sources", len(snap.Sources)).
			Int("contexts", len(snap.Contexts)).Dur("took", time.Since(t0)).Msg("index snapshot loaded from peer")
		return true
	}
	if len(s.opts.Peers) > 0 {
		s.log.Warn().Msg("no peer gave a usable snapshot; falling back to the state directory")
	}
	return false
}

func (s *State) fetch(peer string) (*snapshot.Snapshot, int64, error) {
	timeout := s.opts.PeerTimeout
	if timeout <= 0 {
		timeout = DefaultPeerTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(peer, "/")+SnapshotPath, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("peer URL: %w", err)
	}
	if s.opts.PeerToken != "" {
		req.Header.Set("Authorization", bearer.Header(s.opts.PeerToken))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("request: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("peer answered %s", resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxPeerSnapshot+1))
	if err != nil {
		return nil, 0, fmt.Errorf("transfer after %d bytes: %w", len(data), err)
	}
	if len(data) > maxPeerSnapshot {
		return nil, 0, errors.New("snapshot larger than the limit")
	}
	snap, err := snapshot.Read(data)
	if err != nil {
		return nil, 0, err
	}
	if err := s.tooLarge(snap); err != nil {
		return nil, 0, err
	}
	return snap, int64(len(data)), nil
}

// WriteSnapshot streams a consistent snapshot to w (a peer bootstrapping
// from this replica) while the service keeps serving: the same cut as the
// periodic snapshots, without touching the state directory.
func (s *State) WriteSnapshot(w io.Writer) error {
	if s.reg == nil {
		return errors.New("state not started")
	}
	s.snapMu.Lock()
	snap := s.cut()
	s.snapMu.Unlock()
	return snapshot.Write(w, snap)
}
