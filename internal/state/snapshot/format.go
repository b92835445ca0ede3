// Package snapshot reads and writes the index snapshot file: every context
// with its hash profile, every source with its last applied sequence and
// state, every engine owner's entries and every Mooncake object binding, as
// of one consistent cut. docs/state.md describes the format.
//
// A file is a fixed header followed by sections, each with its own length
// and xxhash64, so a reader tells a truncated or damaged file from a good
// one before it changes anything, and a future release can add section
// kinds. Read validates the whole file, entries included, before it returns
// anything: a snapshot is used entirely or not at all.
package snapshot

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/mooncake-conductor-go/conductor/index"
)

// FileName is the snapshot's name in the state directory.
const FileName = "index.snapshot"

// Version is the format this release writes. Read accepts versions from
// MinVersion to Version and refuses later ones by name, so an older release
// started on a newer release's directory says so instead of guessing.
// Version 2 added the producer-fed scopes (kinds 3 and 4); a version 1 file
// is read as one without them. Version 3 added, in the sources section, a
// standard-hash engine's engine-hash map (std_map, has_std_map) and whether
// a position was still catching up (catching_up); a version 1 or 2 file is
// read as one whose standard-hash engines have no map (they start cold) and
// whose positions a peer cannot vouch for.
const (
	Version    = 3
	MinVersion = 1
)

var magic = [8]byte{'C', 'N', 'D', 'S', 'N', 'A', 'P', 0}

const (
	headerLen        = 32 // magic, version u32, sections u32, created i64, xxhash64 of the 24 before
	sectionHeaderLen = 24 // kind u32, reserved u32, length u64, xxhash64 of those 16 bytes and the payload
)

// Section kinds.
const (
	kindSources   = 1
	kindContext   = 2
	kindScope     = 3 // since version 2
	kindProducers = 4 // since version 2
)

// Snapshot is the decoded content of one file.
type Snapshot struct {
	// Version is the format the file was written in (Read sets it).
	Version uint32
	// Created is when the cut was taken.
	Created  time.Time
	Sources  []StreamPosition
	Contexts []TableSection
	// Scopes and Replicas are the producer-fed side (gRPC producers):
	// each scope's entries and token counts, and every producer replica's
	// liveness and statistics.
	Scopes   []Scope
	Replicas []Replica
}

// Scope is one producer-fed scope's entries.
type Scope struct {
	Scope index.ScopeKey
	// Owners are the scope's replicas; entries refer to them by
	// position, encoded as index.TableCut defines.
	Owners  []string
	Entries []byte
	Blocks  int
	Pairs   int
	// Tokens is, per encoded block in order, the prompt tokens it
	// covers as its producer reported them; negative when none was.
	Tokens []int32
}

// Replica is one producer replica's liveness and statistics at the cut.
// Durations are ages at the cut, so a restart does not count the
// service's downtime against the replica.
type Replica struct {
	Tenant           string  `msgpack:"tenant"`
	Model            string  `msgpack:"model"`
	Replica          string  `msgpack:"replica"`
	SilentNanos      int64   `msgpack:"silent_ns"`
	HasStats         bool    `msgpack:"has_stats"`
	StatsAgeNanos    int64   `msgpack:"stats_age_ns"`
	CacheMemoryBytes int64   `msgpack:"cache_memory_bytes"`
	HitRate          float32 `msgpack:"hit_rate"`
	Pressure         float32 `msgpack:"pressure"`
	ClientVersion    string  `msgpack:"client_version"`
	T2HitTokens      int64   `msgpack:"t2_hit_tokens"`
	T2QueryTokens    int64   `msgpack:"t2_query_tokens"`
}

// scopeMeta is a scope section's MessagePack part; the entries and then
// the token counts follow it raw.
type scopeMeta struct {
	Tenant       string   `msgpack:"tenant"`
	Model        string   `msgpack:"model"`
	Scheme       string   `msgpack:"scheme"`
	Adapter      string   `msgpack:"adapter"`
	Owners       []string `msgpack:"owners"`
	Blocks       int      `msgpack:"blocks"`
	Pairs        int      `msgpack:"pairs"`
	EntriesBytes int      `msgpack:"entries_bytes"`
}

// StreamPosition is one registered service's position in its stream at the cut.
type StreamPosition struct {
	Key  string `msgpack:"key"`
	Type string `msgpack:"type"`
	// Registration fingerprints the registration the position belongs to
	// (an xxhash64 of its /register body), so a restart never hands it to
	// a different registration under the same key.
	Registration uint64 `msgpack:"registration"`
	// Seq is the last applied sequence number; HasSeq is false for a
	// source that had not received anything yet.
	Seq    uint64 `msgpack:"seq"`
	HasSeq bool   `msgpack:"has_seq"`
	// Digest, when HasDigest, is an xxh3-64 of the batch applied at Seq
	// (sources with a replay endpoint), checked against the publisher's
	// replay record after a restart. Files written before it have
	// neither key, and those sources resume unchecked.
	Digest    uint64 `msgpack:"digest,omitempty"`
	HasDigest bool   `msgpack:"has_digest,omitempty"`
	// Stale sources stay stale after a restart; they hold no entries.
	Stale bool `msgpack:"stale"`
	// Bindings are a Mooncake source's object bindings; each holds one
	// shared reference on its block.
	Bindings []Binding `msgpack:"bindings,omitempty"`
	// CatchingUp (since version 3) says the position was restored and not
	// confirmed yet at the cut: a replica bootstrapping from this file
	// must confirm it itself rather than take it from the peer.
	CatchingUp bool `msgpack:"catching_up,omitempty"`
	// StdMap, when HasStdMap (since version 3), is a standard-hash
	// engine's engine-hash → standard-hash map as of Seq. On file it is
	// the bin std_map of fixed records (stdRecordLen bytes each), sorted
	// by group, tier and key.
	StdMap    []StdEntry `msgpack:"-"`
	StdMapBin []byte     `msgpack:"std_map,omitempty"`
	HasStdMap bool       `msgpack:"has_std_map,omitempty"`
}

// StdEntry is one entry of a standard-hash engine's engine-hash map.
type StdEntry struct {
	Group     int32
	Tier      uint8
	Key       uint64
	H         uint64 // 0 when not Reachable
	Reachable bool
}

// stdRecordLen is one std_map record: group (i32), tier (u8), flags (u8,
// bit 0 reachable), key (u64), standard hash (u64), little endian.
const stdRecordLen = 22

// encodeStdMap sorts a copy of es and encodes it as std_map records.
func encodeStdMap(es []StdEntry) []byte {
	sorted := slices.Clone(es)
	slices.SortFunc(sorted, compareStd)
	out := make([]byte, 0, len(sorted)*stdRecordLen)
	for _, e := range sorted {
		out = binary.LittleEndian.AppendUint32(out, uint32(e.Group))
		flags := byte(0)
		if e.Reachable {
			flags = 1
		}
		out = append(out, e.Tier, flags)
		out = binary.LittleEndian.AppendUint64(out, e.Key)
		out = binary.LittleEndian.AppendUint64(out, e.H)
	}
	return out
}

func compareStd(a, b StdEntry) int {
	return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Tier, b.Tier), cmp.Compare(a.Key, b.Key))
}

// decodeStdMap reads std_map records, refusing a malformed one: a length
// that is not whole records, a tier no engine holds, unknown flags, a hash
// on an unreachable block, or records out of order or repeated.
func decodeStdMap(b []byte) ([]StdEntry, error) {
	if len(b)%stdRecordLen != 0 {
		return nil, fmt.Errorf("std_map of %d bytes is not whole records", len(b))
	}
	out := make([]StdEntry, 0, len(b)/stdRecordLen)
	for p := 0; p < len(b); p += stdRecordLen {
		r := b[p : p+stdRecordLen]
		e := StdEntry{Group: int32(binary.LittleEndian.Uint32(r)), Tier: r[4], Reachable: r[5] == 1,
			Key: binary.LittleEndian.Uint64(r[6:]), H: binary.LittleEndian.Uint64(r[14:])}
		switch {
		case index.Tier(e.Tier) != index.Device && index.Tier(e.Tier) != index.CPULocal && index.Tier(e.Tier) != index.Disk:
			return nil, fmt.Errorf("std_map record %d: tier %d", p/stdRecordLen, e.Tier)
		case r[5] > 1:
			return nil, fmt.Errorf("std_map record %d: flags %#x", p/stdRecordLen, r[5])
		case !e.Reachable && e.H != 0:
			return nil, fmt.Errorf("std_map record %d: a standard hash on an unreachable block", p/stdRecordLen)
		case len(out) > 0 && compareStd(out[len(out)-1], e) >= 0:
			return nil, fmt.Errorf("std_map record %d out of order or repeated", p/stdRecordLen)
		}
		out = append(out, e)
	}
	return out, nil
}

// Binding is one object (or SGLang logical page) a Mooncake master
// reported in a shared tier.
type Binding struct {
	Backend    string   `msgpack:"backend"`
	Tenant     string   `msgpack:"tenant"`
	Identity   string   `msgpack:"identity"`
	Tier       uint8    `msgpack:"tier"`
	Model      string   `msgpack:"model"`
	Lora       string   `msgpack:"lora"`
	BlockSize  int      `msgpack:"block_size"`
	Prefix     uint64   `msgpack:"prefix"`
	FullHash   string   `msgpack:"full_hash"`
	Group      string   `msgpack:"group"`
	Components []string `msgpack:"components,omitempty"`
}

// Profile is a context's hash profile as registered.
type Profile struct {
	Strategy        string `msgpack:"strategy"`
	Algorithm       string `msgpack:"algorithm"`
	IndexProjection string `msgpack:"index_projection"`
	PythonHashSeed  string `msgpack:"python_hash_seed"`
	// Seed is rfc1527's seed text; absent for the other strategies, so
	// their snapshots are byte for byte as before.
	Seed string `msgpack:"seed,omitempty"`
}

// TableSection is one table's engine entries.
type TableSection struct {
	Context index.ContextKey
	Profile Profile
	// Owners and Entries are as index.TableCut defines them.
	Owners  []index.Owner
	Entries []byte
	Blocks  int
	Pairs   int
	// Layouts are the owners' hybrid layouts by position, as
	// index.TableCut has them (nil when every owner is dense).
	Layouts []index.Layout
}

// contextMeta is a context section's MessagePack part; the entries follow
// it raw.
type contextMeta struct {
	Tenant    string        `msgpack:"tenant"`
	Model     string        `msgpack:"model"`
	Lora      string        `msgpack:"lora"`
	BlockSize int           `msgpack:"block_size"`
	Profile   Profile       `msgpack:"profile"`
	Owners    []ownerRecord `msgpack:"owners"`
	Blocks    int           `msgpack:"blocks"`
	Pairs     int           `msgpack:"pairs"`
}

type ownerRecord struct {
	Instance string `msgpack:"instance"`
	Rank     int    `msgpack:"rank"`
	// Layout is a hybrid owner's KV-cache group layout (docs/hybrid.md);
	// absent for a dense owner, so files without hybrid owners are as
	// before and older files read as all dense.
	Layout *layoutRecord `msgpack:"layout,omitempty"`
}

type layoutRecord struct {
	Declared bool          `msgpack:"declared"`
	Overflow bool          `msgpack:"overflow"`
	Groups   []groupRecord `msgpack:"groups"`
}

type groupRecord struct {
	Kind          uint8 `msgpack:"kind"`
	BlockSize     int   `msgpack:"block_size"`
	SlidingWindow int   `msgpack:"sliding_window"`
	ChunkSize     int   `msgpack:"chunk_size"`
}

func layoutOf(l *index.Layout) *layoutRecord {
	if len(l.Groups) == 0 && !l.Overflow {
		return nil
	}
	r := &layoutRecord{Declared: l.Declared, Overflow: l.Overflow, Groups: make([]groupRecord, len(l.Groups))}
	for i, g := range l.Groups {
		r.Groups[i] = groupRecord{Kind: uint8(g.Kind), BlockSize: g.BlockSize, SlidingWindow: g.SlidingWindow, ChunkSize: g.ChunkSize}
	}
	return r
}

func (r *layoutRecord) layout() (index.Layout, error) {
	l := index.Layout{Declared: r.Declared, Overflow: r.Overflow}
	if len(r.Groups) > index.MaxGroups {
		return l, fmt.Errorf("a layout of %d groups", len(r.Groups))
	}
	for _, g := range r.Groups {
		if index.GroupKind(g.Kind) >= index.NumGroupKinds || g.BlockSize < 0 || g.SlidingWindow < 0 || g.ChunkSize < 0 {
			return l, fmt.Errorf("a malformed KV-cache group %+v", g)
		}
		l.Groups = append(l.Groups, index.GroupSpec{Kind: index.GroupKind(g.Kind), BlockSize: g.BlockSize, SlidingWindow: g.SlidingWindow, ChunkSize: g.ChunkSize})
	}
	return l, nil
}

// Write encodes s to w. The caller makes it durable (statedir.WriteAtomic).
func Write(w io.Writer, s *Snapshot) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	hdr := make([]byte, 0, headerLen)
	hdr = append(hdr, magic[:]...)
	hdr = binary.LittleEndian.AppendUint32(hdr, Version)
	nsec := 1 + len(s.Contexts) + len(s.Scopes)
	if len(s.Replicas) > 0 {
		nsec++
	}
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(nsec))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(s.Created.UnixNano()))
	hdr = binary.LittleEndian.AppendUint64(hdr, xxhash.Sum64(hdr))
	if _, err := bw.Write(hdr); err != nil {
		return err
	}
	sources := slices.Clone(s.Sources)
	for i := range sources {
		if sources[i].HasStdMap {
			sources[i].StdMapBin = encodeStdMap(sources[i].StdMap)
		}
	}
	src, err := marshal(sources)
	if err != nil {
		return fmt.Errorf("encode sources: %w", err)
	}
	if err := writeSection(bw, kindSources, src); err != nil {
		return err
	}
	for i := range s.Contexts {
		c := &s.Contexts[i]
		m := contextMeta{Tenant: c.Context.Tenant, Model: c.Context.Model, Lora: c.Context.Lora, BlockSize: c.Context.BlockSize,
			Profile: c.Profile, Blocks: c.Blocks, Pairs: c.Pairs, Owners: make([]ownerRecord, len(c.Owners))}
		for j, o := range c.Owners {
			m.Owners[j] = ownerRecord{Instance: o.Instance, Rank: o.Rank}
			if j < len(c.Layouts) {
				m.Owners[j].Layout = layoutOf(&c.Layouts[j])
			}
		}
		head, err := metaHead(&m)
		if err != nil {
			return fmt.Errorf("encode context: %w", err)
		}
		if err := writeSection(bw, kindContext, head, c.Entries); err != nil {
			return err
		}
	}
	for i := range s.Scopes {
		c := &s.Scopes[i]
		if len(c.Tokens) != c.Blocks {
			return fmt.Errorf("encode scope: %d token counts for %d blocks", len(c.Tokens), c.Blocks)
		}
		m := scopeMeta{Tenant: c.Scope.Tenant, Model: c.Scope.Model, Scheme: c.Scope.Scheme, Adapter: c.Scope.Adapter,
			Owners: c.Owners, Blocks: c.Blocks, Pairs: c.Pairs, EntriesBytes: len(c.Entries)}
		head, err := metaHead(&m)
		if err != nil {
			return fmt.Errorf("encode scope: %w", err)
		}
		toks := make([]byte, 0, len(c.Tokens)*2)
		for _, t := range c.Tokens {
			toks = binary.AppendUvarint(toks, uint64(int64(max(t, -1))+1)) // 0: none
		}
		if err := writeSection(bw, kindScope, head, c.Entries, toks); err != nil {
			return err
		}
	}
	if len(s.Replicas) > 0 {
		reps, err := marshal(s.Replicas)
		if err != nil {
			return fmt.Errorf("encode producers: %w", err)
		}
		if err := writeSection(bw, kindProducers, reps); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeSection writes one section whose payload is the concatenation of
// parts (so large entry buffers are not copied).
func writeSection(w io.Writer, kind uint32, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	h := make([]byte, 0, sectionHeaderLen)
	h = binary.LittleEndian.AppendUint32(h, kind)
	h = binary.LittleEndian.AppendUint32(h, 0)
	h = binary.LittleEndian.AppendUint64(h, uint64(n))
	d := xxhash.New()
	d.Write(h)
	for _, p := range parts {
		d.Write(p)
	}
	h = binary.LittleEndian.AppendUint64(h, d.Sum64())
	if _, err := w.Write(h); err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// FormatError is a snapshot that cannot be used: missing, truncated,
// damaged or from a later release. Reason says which, for the log.
type FormatError struct {
	Reason string
}

func (e *FormatError) Error() string { return "unusable snapshot: " + e.Reason }

func bad(format string, args ...any) error {
	return &FormatError{Reason: fmt.Sprintf(format, args...)}
}

// Read decodes and fully validates a snapshot file's bytes. Context entries
// alias data.
func Read(data []byte) (*Snapshot, error) {
	if len(data) < headerLen {
		return nil, bad("truncated: %d bytes, shorter than the header", len(data))
	}
	if !bytes.Equal(data[:8], magic[:]) {
		return nil, bad("not a snapshot file (bad magic)")
	}
	if xxhash.Sum64(data[:headerLen-8]) != binary.LittleEndian.Uint64(data[headerLen-8:]) {
		return nil, bad("header checksum mismatch")
	}
	v := binary.LittleEndian.Uint32(data[8:])
	if v > Version {
		return nil, bad("written in format version %d; this release reads versions %d to %d", v, MinVersion, Version)
	}
	if v < MinVersion {
		return nil, bad("format version %d is older than this release reads (%d to %d)", v, MinVersion, Version)
	}
	nsec := binary.LittleEndian.Uint32(data[12:])
	s := &Snapshot{Version: v, Created: time.Unix(0, int64(binary.LittleEndian.Uint64(data[16:]))).UTC()}
	p := headerLen
	sawSources, sawProducers := false, false
	for i := uint32(0); i < nsec; i++ {
		if len(data)-p < sectionHeaderLen {
			return nil, bad("truncated: section %d of %d missing", i+1, nsec)
		}
		head := data[p : p+sectionHeaderLen-8]
		kind := binary.LittleEndian.Uint32(head)
		n := binary.LittleEndian.Uint64(head[8:])
		sum := binary.LittleEndian.Uint64(data[p+16:])
		p += sectionHeaderLen
		if n > uint64(len(data)-p) {
			return nil, bad("truncated: section %d of %d is cut short", i+1, nsec)
		}
		payload := data[p : p+int(n)]
		p += int(n)
		d := xxhash.New()
		d.Write(head)
		d.Write(payload)
		if d.Sum64() != sum {
			return nil, bad("checksum mismatch in section %d of %d", i+1, nsec)
		}
		switch kind {
		case kindSources:
			if sawSources {
				return nil, bad("two source sections")
			}
			sawSources = true
			if err := msgpack.Unmarshal(payload, &s.Sources); err != nil {
				return nil, bad("sources section: %v", err)
			}
			if err := readStdMaps(s.Sources, v); err != nil {
				return nil, bad("sources section: %v", err)
			}
		case kindContext:
			c, err := readContext(payload)
			if err != nil {
				return nil, bad("context section %d: %v", i+1, err)
			}
			s.Contexts = append(s.Contexts, c)
		case kindScope:
			if v < 2 {
				return nil, bad("section kind %d in a version %d file", kind, v)
			}
			c, err := readScope(payload)
			if err != nil {
				return nil, bad("scope section %d: %v", i+1, err)
			}
			s.Scopes = append(s.Scopes, c)
		case kindProducers:
			if v < 2 {
				return nil, bad("section kind %d in a version %d file", kind, v)
			}
			if sawProducers {
				return nil, bad("two producer sections")
			}
			sawProducers = true
			if err := msgpack.Unmarshal(payload, &s.Replicas); err != nil {
				return nil, bad("producer section: %v", err)
			}
			for _, r := range s.Replicas {
				if r.SilentNanos < 0 || r.StatsAgeNanos < 0 {
					return nil, bad("producer section: negative age for replica %q", r.Replica)
				}
			}
		default:
			return nil, bad("unknown section kind %d", kind)
		}
	}
	if p != len(data) {
		return nil, bad("%d bytes after the last section", len(data)-p)
	}
	if !sawSources {
		return nil, bad("no source section")
	}
	return s, nil
}

// readStdMaps decodes every source's std_map; keys of version 3 in an
// older file are refused.
func readStdMaps(srcs []StreamPosition, v uint32) error {
	for i := range srcs {
		src := &srcs[i]
		if v < 3 && (src.HasStdMap || src.StdMapBin != nil || src.CatchingUp) {
			return fmt.Errorf("source %q has keys of version 3 in a version %d file", src.Key, v)
		}
		if !src.HasStdMap {
			if src.StdMapBin != nil {
				return fmt.Errorf("source %q has std_map without has_std_map", src.Key)
			}
			continue
		}
		es, err := decodeStdMap(src.StdMapBin)
		if err != nil {
			return fmt.Errorf("source %q: %w", src.Key, err)
		}
		src.StdMap, src.StdMapBin = es, nil
	}
	return nil
}

// metaHead is a table section's head: its metadata's length (4 bytes,
// little endian), then the metadata.
func metaHead(m any) ([]byte, error) {
	meta, err := marshal(m)
	if err != nil {
		return nil, err
	}
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(meta))), meta...), nil
}

// splitMeta reads a table section's head (metaHead) into m and returns
// what follows it.
func splitMeta(payload []byte, m any) ([]byte, error) {
	if len(payload) < 4 {
		return nil, fmt.Errorf("cut short")
	}
	n := binary.LittleEndian.Uint32(payload)
	if uint64(n) > uint64(len(payload)-4) {
		return nil, fmt.Errorf("metadata cut short")
	}
	if err := msgpack.Unmarshal(payload[4:4+n], m); err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	return payload[4+n:], nil
}

// checkEntries walks a table's entries and compares their counts with the
// metadata's, so that a section is refused whole before anything of it is
// restored.
func checkEntries(entries []byte, owners, blocks, pairs int) error {
	gotBlocks, gotPairs, err := index.WalkEntries(entries, owners, nil)
	if err != nil {
		return err
	}
	if gotBlocks != blocks || gotPairs != pairs {
		return fmt.Errorf("holds %d blocks and %d pairs, metadata says %d and %d", gotBlocks, gotPairs, blocks, pairs)
	}
	return nil
}

// checkOwners refuses an owner list with an empty or repeated owner:
// entries refer to owners by position, and a restore would map two
// positions to one owner and lose one's entries.
func checkOwners[K comparable](owners []K, empty func(K) bool) error {
	seen := make(map[K]bool, len(owners))
	for _, o := range owners {
		if empty(o) || seen[o] {
			return fmt.Errorf("owner %v empty or listed twice", o)
		}
		seen[o] = true
	}
	return nil
}

func readContext(payload []byte) (TableSection, error) {
	var c TableSection
	var m contextMeta
	entries, err := splitMeta(payload, &m)
	if err != nil {
		return c, err
	}
	c = TableSection{
		Context: index.ContextKey{Tenant: m.Tenant, Model: m.Model, Lora: m.Lora, BlockSize: m.BlockSize},
		Profile: m.Profile, Blocks: m.Blocks, Pairs: m.Pairs,
		Owners:  make([]index.Owner, len(m.Owners)),
		Entries: entries,
	}
	for i, o := range m.Owners {
		c.Owners[i] = index.Owner{Instance: o.Instance, Rank: o.Rank}
		if o.Layout != nil {
			if c.Layouts == nil {
				c.Layouts = make([]index.Layout, len(m.Owners))
			}
			l, err := o.Layout.layout()
			if err != nil {
				return c, err
			}
			c.Layouts[i] = l
		}
	}
	if err := checkOwners(c.Owners, func(o index.Owner) bool { return o.Instance == "" }); err != nil {
		return c, err
	}
	return c, checkEntries(c.Entries, len(c.Owners), c.Blocks, c.Pairs)
}

func readScope(payload []byte) (Scope, error) {
	var c Scope
	var m scopeMeta
	rest, err := splitMeta(payload, &m)
	if err != nil {
		return c, err
	}
	if m.EntriesBytes < 0 || m.EntriesBytes > len(rest) {
		return c, fmt.Errorf("entries cut short")
	}
	if m.Scheme == "" || m.Tenant == "" || m.Model == "" {
		return c, fmt.Errorf("scope without tenant, model or scheme")
	}
	if err := checkOwners(m.Owners, func(o string) bool { return o == "" }); err != nil {
		return c, err
	}
	c = Scope{
		Scope:  index.ScopeKey{Tenant: m.Tenant, Model: m.Model, Scheme: m.Scheme, Adapter: m.Adapter},
		Owners: m.Owners, Blocks: m.Blocks, Pairs: m.Pairs,
		Entries: rest[:m.EntriesBytes],
	}
	if err := checkEntries(c.Entries, len(c.Owners), c.Blocks, c.Pairs); err != nil {
		return c, err
	}
	blocks := c.Blocks
	toks := rest[m.EntriesBytes:]
	c.Tokens = make([]int32, 0, blocks)
	for len(toks) > 0 {
		t, w := binary.Uvarint(toks)
		if w <= 0 || t > 1<<31 {
			return c, fmt.Errorf("token count %d malformed", len(c.Tokens))
		}
		c.Tokens = append(c.Tokens, int32(int64(t)-1))
		toks = toks[w:]
	}
	if len(c.Tokens) != blocks {
		return c, fmt.Errorf("%d token counts for %d blocks", len(c.Tokens), blocks)
	}
	return c, nil
}
