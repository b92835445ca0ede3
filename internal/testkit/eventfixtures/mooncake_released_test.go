package eventfixtures

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestReleasedMasterBytes spells out, byte by byte and without the
// generator's encoder, what the released master's PublishBatch packs for
// one removal with legacy fields and object keys on (msgpack-c picks each
// width: fixint event_id, uint64 timestamp, fixstr keys, the key's parsed
// hash as uint64 and its legacy alias as int64), and compares the
// generator's payload with it.
func TestReleasedMasterBytes(t *testing.T) {
	var b bytes.Buffer
	str := func(s string) {
		if len(s) >= 32 {
			t.Fatalf("%q is not a fixstr", s)
		}
		b.WriteByte(0xa0 | byte(len(s)))
		b.WriteString(s)
	}
	u64 := func(marker byte, v uint64) {
		b.WriteByte(marker)
		_ = binary.Write(&b, binary.BigEndian, v)
	}
	nilv := func() { b.WriteByte(0xc0) }
	hash := uint64(0xfedcba9876543210)

	b.WriteByte(0x93)            // [timestamp, events, dp_rank]
	u64(0xcf, uint64(mts))       // int64 milliseconds above 2^32: uint 64
	b.WriteByte(0x91)            // one event
	b.Write([]byte{0xde, 0, 17}) // ComputeEventMapSize(removed, legacy, object_key) = 13+2+1+1
	str("event_id")
	b.WriteByte(5)
	str("timestamp")
	u64(0xcf, uint64(mts))
	str("event_type")
	str("removed")
	str("type")
	str("BlockRemoved")
	for _, k := range []string{"model_name", "block_size", "additional_salt", "lora_name"} {
		str(k)
		nilv()
	}
	str("tenant_id")
	str("default")
	str("backend_id")
	str("pool-r")
	str("group_id")
	nilv()
	str("medium")
	str("cpu")
	str("dp_rank")
	nilv()
	str("object_key")
	str("0xfedcba9876543210")
	str("seq_hashes")
	b.WriteByte(0x91)
	u64(0xcf, hash)
	str("block_hashes")
	b.WriteByte(0x91)
	u64(0xd3, hash) // static_cast<int64_t>: the same bits, negative
	str("base_block_idx")
	nilv()
	b.WriteByte(0x00) // batch-level dp_rank, uint32 0

	got := packMsgpack(rBatch(rEvent("removed", ro{key: "0xfedcba9876543210", medium: "cpu", seqHash: &hash, eventID: 5})))
	if diff := cmp.Diff(b.Bytes(), got); diff != "" {
		t.Errorf("payload (-publisher +generator):\n%s", diff)
	}
}

// TestReleasedMasterMapSizes: every event map has the field count the
// publisher's ComputeEventMapSize declares for its flags.
func TestReleasedMasterMapSizes(t *testing.T) {
	for _, c := range []struct {
		kind               string
		noLegacy, noObjKey bool
		want               int
	}{
		{"stored", false, false, 20}, {"stored", true, false, 17}, {"stored", false, true, 19}, {"stored", true, true, 16},
		{"removed", false, false, 17}, {"removed", true, false, 15}, {"removed", false, true, 16}, {"removed", true, true, 14},
	} {
		ev := rEvent(c.kind, ro{key: "k", medium: "cpu", noLegacy: c.noLegacy, noObjectKey: c.noObjKey})
		if len(ev) != c.want {
			t.Errorf("%s legacy=%v object_key=%v: %d fields, want %d", c.kind, !c.noLegacy, !c.noObjKey, len(ev), c.want)
		}
	}
}
