// Package bearer is the one check of the shared bearer token
// (--auth-token-file) that both doors ask of the calls that change state:
// HTTP /register, /unregister and /snapshot, gRPC ReportCacheState and
// PublishEvent. Its clients (a peer replica, the operator CLI, the load
// generator) build the header with Header.
package bearer

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
)

const scheme = "Bearer "

// Token is the configured token, kept as its SHA-256 sum. The zero Token
// (no token configured) requires nothing.
type Token struct {
	set bool
	sum [sha256.Size]byte
}

// New is the token; "" means none is required.
func New(token string) Token {
	if token == "" {
		return Token{}
	}
	return Token{set: true, sum: sha256.Sum256([]byte(token))}
}

// Required reports whether a token is configured.
func (t Token) Required() bool { return t.set }

// Allows reports whether an Authorization value carries the token (always
// true when none is required). It compares SHA-256 sums in constant time,
// so response timing reveals neither the token's length nor how much of a
// guess was right.
func (t Token) Allows(authorization []byte) bool {
	if !t.set {
		return true
	}
	tok, ok := bytes.CutPrefix(authorization, []byte(scheme))
	if !ok {
		return false
	}
	got := sha256.Sum256(tok)
	return subtle.ConstantTimeCompare(got[:], t.sum[:]) == 1
}

// Header is the Authorization value that carries token.
func Header(token string) string { return scheme + token }
