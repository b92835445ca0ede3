package events

import (
	"github.com/mooncake-conductor-go/conductor/internal/msgp"
)

// Event payloads are read with msgp.Reader: every value's kind is peeked
// before it is read, so a wrong type becomes an event-level rejection (the
// value is then skipped) rather than a decode error that would abort the
// whole envelope.

// optInt reads int|nil as a signed value; ok=false means another type (or a
// value beyond int64), skipped or consumed.
func optInt(r *msgp.Reader) (v int64, present, ok bool, err error) {
	k, err := r.Peek()
	if err != nil {
		return 0, false, false, err
	}
	switch k {
	case msgp.Nil:
		return 0, false, true, r.Nil()
	case msgp.Int:
		u, neg, err := r.Integer()
		if err != nil {
			return 0, false, false, err
		}
		v, ok := msgp.Int64Range(u, neg)
		return v, true, ok, nil
	}
	return 0, false, false, r.Skip()
}

// rejecter is an event under decoding that can be rejected; the first
// reason given is the one reported.
type rejecter interface{ fail(Reason) }

// eventMapReader is one event being decoded by readEventMap: it names the
// recognized keys, records which were seen, and reads their values.
type eventMapReader interface {
	rejecter
	// fieldID maps a key to its field id; known is false for keys to
	// ignore (forward compatibility).
	fieldID(key []byte) (id uint8, known bool)
	// seenMask is the set of field ids read so far (bit id).
	seenMask() *uint32
	// failed reports whether the event is already rejected; its remaining
	// values are then skipped, though duplicates are still noticed.
	failed() bool
	readField(r *msgp.Reader, id uint8) error
}

// readEventMap reads one element of a batch's event array with the rules every
// event family shares (docs/events.md#event-rules): an element that is not a
// map is rejected (engine decoders read array-encoded events before they get
// here, positional.go), non-string keys
// and repeated recognized keys reject the event, unknown keys are skipped, and
// nothing is read after a rejection. It returns only payload-level errors (the
// envelope is then rejected); event rejections go through fail.
func readEventMap(r *msgp.Reader, ev eventMapReader) error {
	k, err := r.Peek()
	if err != nil {
		return err
	}
	if k != msgp.Map {
		ev.fail(EvNotMap)
		return r.Skip()
	}
	n, err := r.MapLen()
	if err != nil {
		return err
	}
	seen := ev.seenMask()
	for i := 0; i < n; i++ {
		k, err := r.Peek()
		if err != nil {
			return err
		}
		if k != msgp.Str {
			ev.fail(EvNonStringKey)
			if err := r.Skip(); err != nil {
				return err
			}
			if err := r.Skip(); err != nil {
				return err
			}
			continue
		}
		key, err := r.Str()
		if err != nil {
			return err
		}
		id, known := ev.fieldID(key)
		switch {
		case !known:
			err = r.Skip()
		case *seen&(1<<id) != 0:
			ev.fail(EvDuplicateKey)
			err = r.Skip()
		case ev.failed():
			*seen |= 1 << id
			err = r.Skip()
		default:
			*seen |= 1 << id
			err = ev.readField(r, id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// readTokenArray checks a token_ids array (docs/events.md#token-ids): every id
// within int32, and, when pairs is set (SGLang EAGLE bigram keys), elements may
// also be [a, b] pairs of ids. Token ids are only range-checked, never kept or
// logged; runs of plain integers are scanned in place (msgp.ScanInt32Run).
func readTokenArray(r *msgp.Reader, pairs bool, ev rejecter) error {
	n, err := r.ArrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		run, ok := r.Int32Run(n - i)
		if !ok {
			ev.fail(EvTokenRange)
		}
		if i += run; i == n {
			break
		}
		k, err := r.Peek()
		if err != nil {
			return err
		}
		switch {
		case k == msgp.Int:
			if err := readTokenID(r, ev); err != nil {
				return err
			}
		case k == msgp.Array && pairs:
			m, err := r.ArrayLen()
			if err != nil {
				return err
			}
			if m != 2 {
				ev.fail(EvTokenRange)
			}
			for j := 0; j < m; j++ {
				k, err := r.Peek()
				if err != nil {
					return err
				}
				if k != msgp.Int {
					ev.fail(EvWrongType)
					if err := r.Skip(); err != nil {
						return err
					}
					continue
				}
				if err := readTokenID(r, ev); err != nil {
					return err
				}
			}
		default:
			ev.fail(EvWrongType)
			if err := r.Skip(); err != nil {
				return err
			}
		}
	}
	return nil
}

func readTokenID(r *msgp.Reader, ev rejecter) error {
	u, neg, err := r.Integer()
	if err != nil {
		return err
	}
	if !msgp.Int32Range(u, neg) {
		ev.fail(EvTokenRange)
	}
	return nil
}
