// Package querybody builds /query bodies as a Python router packs them,
// for the tests and benchmarks of the codec and the token memo.
package querybody

import "encoding/binary"

// Pack returns a /query body (model "m", block size 16) of n token ids
// drawn from a vocabulary of vocab ids, each in MessagePack's smallest
// integer format as Python's packer writes it, or all as int32 when
// int32s is set. The ids are a fixed pseudo-random sequence, so the same
// arguments give the same bytes.
func Pack(n, vocab int, int32s bool) []byte {
	body := []byte{0x83, 0xa5, 'm', 'o', 'd', 'e', 'l', 0xa1, 'm', 0xaa, 'b', 'l', 'o', 'c', 'k', '_', 's', 'i', 'z', 'e', 0x10,
		0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0xdd}
	body = binary.BigEndian.AppendUint32(body, uint32(n))
	x := uint32(12345)
	for range n {
		x = x*1664525 + 1013904223
		v := x >> 8 % uint32(vocab)
		switch {
		case int32s:
			body = binary.BigEndian.AppendUint32(append(body, 0xd2), v)
		case v <= 0x7f:
			body = append(body, byte(v))
		case v <= 0xff:
			body = append(body, 0xcc, byte(v))
		case v <= 0xffff:
			body = binary.BigEndian.AppendUint16(append(body, 0xcd), uint16(v))
		default:
			body = binary.BigEndian.AppendUint32(append(body, 0xce), v)
		}
	}
	return body
}
