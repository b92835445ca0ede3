package events

import (
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
)

// Engines before their switch to map-encoded events (vLLM before v0.26.0,
// SGLang 0.5.18 and earlier) encode each event as a tagged array: the tag,
// then the struct's fields in declaration order, trailing fields equal to
// their default left out (docs/events.md#array-encoded-events; every
// release's field list is in docs/engines.md#event-layouts). An array event
// is read position by position into the same fields, through the same
// readers, as a map event, so both dialects meet the same rules.

// layout is one event kind's field order in the array encoding: ids[i] is
// the field at array position i+1 (position 0 is the tag). The first
// required positions are in every release; the rest are optional by
// position, because a release predating a field never sends it and msgspec
// omits trailing defaults.
type layout struct {
	ids      []uint8
	required int
}

// readEventArray reads an array-encoded event into f, as readEventMap does a
// map: the tag picks the kind's layout, each known position is read as the
// field of that name, and positions past the newest known layout are
// skipped (a newer release appended fields). Positions a short array left
// out count as present with their default, so the kind's required keys are
// those of the layout's required prefix; a missing medium is the engine's
// default medium (engineRules.absentMedium).
func (d *engineDecoder) readEventArray(r *msgp.Reader, f *engineFields) error {
	n, err := r.ArrayLen()
	if err != nil {
		return err
	}
	if n == 0 {
		f.fail(EvMissingKey) // not even a tag
		return nil
	}
	f.seen |= bit(fType)
	if err := d.readField(r, fType, f); err != nil {
		return err
	}
	var lay *layout
	if f.reject == ReasonNone {
		switch string(f.v.strs[sTag]) {
		case "BlockStored":
			lay = &d.rules.positions[evStored]
		case "BlockRemoved":
			lay = &d.rules.positions[evRemoved]
		case "AllBlocksCleared":
			lay = &d.rules.positions[evCleared]
		}
	}
	// An unknown tag reads nothing more: validate rejects it by its tag.
	for i := 1; i < n; i++ {
		if lay == nil || i > len(lay.ids) || f.reject != ReasonNone {
			if err := r.Skip(); err != nil {
				return err
			}
			continue
		}
		id := lay.ids[i-1]
		f.seen |= bit(id)
		if err := d.readField(r, id, f); err != nil {
			return err
		}
	}
	if lay == nil || f.reject != ReasonNone {
		return nil
	}
	if n-1 < lay.required {
		f.fail(EvMissingKey)
		return nil
	}
	for _, id := range lay.ids[min(n-1, len(lay.ids)):] {
		f.seen |= bit(id)
		if id == fMedium {
			f.v.strs[sMedium] = d.rules.absentMedium
		}
	}
	return nil
}

// readMetadata reads SGLang's block-metadata map, the last position of an
// array-encoded BlockStored that carries a cache salt: cache_salt is read
// as the map dialect's key of that name (type-checked, and located for the
// hash check); other keys are skipped. Nil stands for no metadata.
func (d *engineDecoder) readMetadata(r *msgp.Reader, k msgp.Kind, f *engineFields) error {
	switch k {
	case msgp.Nil:
		return r.Nil()
	case msgp.Map:
	default:
		f.fail(EvWrongType)
		return r.Skip()
	}
	d.metaEv = metadataMapEvent{engineMapEvent{d: d, f: f}}
	return readEventMap(r, &d.metaEv)
}

// metadataMapEvent reads the block-metadata map by the rules of an event
// map (non-string keys and a repeated cache_salt reject the event, other
// keys are skipped): cache_salt is its one recognized key, read into the
// event's field of that name.
type metadataMapEvent struct{ engineMapEvent }

func (e *metadataMapEvent) fieldID(key []byte) (uint8, bool) {
	return fCacheSalt, string(key) == "cache_salt"
}
