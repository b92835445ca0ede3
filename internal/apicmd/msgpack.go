package apicmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/vmihailenco/msgpack/v5"
)

// JSONToMsgpack re-encodes one JSON value as MessagePack, value for
// value: objects keep their members' order and any repeated member (the
// server refuses those, and should see them), integers become the
// smallest MessagePack integer that holds them, other numbers float64,
// so the server judges a 16.0 exactly as it would from a router. Nothing
// may follow the value.
func JSONToMsgpack(data []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var out bytes.Buffer
	if err := encodeValue(dec, &out); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty input")
		}
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("unexpected data after the value at offset %d", dec.InputOffset())
	}
	return out.Bytes(), nil
}

// encodeValue appends the next JSON value of dec to out. An array's or
// object's members are encoded into a buffer of their own first, since
// MessagePack puts the count before them; the copy costs one pass per
// nesting level, and requests nest two deep.
func encodeValue(dec *json.Decoder, out *bytes.Buffer) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	enc := msgpack.NewEncoder(out)
	switch t := tok.(type) {
	case json.Delim:
		var members bytes.Buffer
		n := 0
		for dec.More() {
			if t == '{' {
				key, err := dec.Token()
				if err != nil {
					return err
				}
				if err := msgpack.NewEncoder(&members).EncodeString(key.(string)); err != nil {
					return err
				}
			}
			if err := encodeValue(dec, &members); err != nil {
				return err
			}
			n++
		}
		if _, err := dec.Token(); err != nil { // the closing delimiter
			return err
		}
		if t == '{' {
			err = enc.EncodeMapLen(n)
		} else {
			err = enc.EncodeArrayLen(n)
		}
		if err != nil {
			return err
		}
		_, err = out.Write(members.Bytes())
		return err
	case string:
		return enc.EncodeString(t)
	case json.Number:
		return encodeNumber(enc, t)
	case bool:
		return enc.EncodeBool(t)
	case nil:
		return enc.EncodeNil()
	}
	return fmt.Errorf("unexpected JSON token %v", tok)
}

func encodeNumber(enc *msgpack.Encoder, n json.Number) error {
	s := n.String()
	if !strings.ContainsAny(s, ".eE") {
		if v, err := strconv.ParseInt(s, 10, 64); err == nil {
			return enc.EncodeInt(v)
		}
		if v, err := strconv.ParseUint(s, 10, 64); err == nil {
			return enc.EncodeUint(v)
		}
		return fmt.Errorf("integer %s does not fit in 64 bits", s)
	}
	f, err := n.Float64()
	if err != nil {
		return fmt.Errorf("number %s: %w", s, err)
	}
	return enc.EncodeFloat64(f)
}
