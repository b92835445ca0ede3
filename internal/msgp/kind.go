package msgp

// Kind is the family of a MessagePack value, as its first byte tells.
type Kind uint8

// Kinds. Int covers every integer format, signed or not: producers may
// encode a positive value in a signed format, so callers decide by value.
const (
	Invalid Kind = iota // 0xc1, never used by the format
	Nil
	Bool
	Int
	Float
	Str
	Bin
	Array
	Map
	Ext
)

var kindNames = [...]string{"invalid", "nil", "bool", "integer", "float", "string", "binary", "array", "map", "extension"}

// String names the kind as error messages spell it ("integer", "string").
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "invalid"
}

// kinds is the kind of every first byte. A table rather than a switch:
// decoders peek before every value, and a lookup costs the same whatever
// the byte.
var kinds = func() (t [256]Kind) {
	for c := range t {
		t[c] = kindOfByte(byte(c))
	}
	return t
}()

// KindOf returns the kind of the value whose first byte is c.
func KindOf(c byte) Kind { return kinds[c] }

func kindOfByte(c byte) Kind {
	switch {
	case c <= 0x7f, c >= 0xe0:
		return Int
	case c <= 0x8f:
		return Map
	case c <= 0x9f:
		return Array
	case c <= 0xbf:
		return Str
	}
	switch c {
	case 0xc0:
		return Nil
	case 0xc2, 0xc3:
		return Bool
	case 0xc4, 0xc5, 0xc6:
		return Bin
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return Ext
	case 0xca, 0xcb:
		return Float
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return Int
	case 0xd9, 0xda, 0xdb:
		return Str
	case 0xdc, 0xdd:
		return Array
	case 0xde, 0xdf:
		return Map
	}
	return Invalid
}
