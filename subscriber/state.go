package subscriber

import "fmt"

// State is a subscriber's externally visible condition, so the registry and
// metrics can tell a healthy source from one whose entries were retracted.
type State int32

// States. Stale lasts until the service is registered again or, under
// StaleRecoveryAuto, until the first message after the hold-off.
// Disconnected is the connection's word over the stream's: a source that
// would be connected, live or recovering but whose publisher connection is
// known gone (link.go) reports it, and goes back when the connection does.
const (
	Connecting   State = iota // socket created, connection not known to be up
	Connected                 // connection up (Subscriber.Connected), no batch yet
	Live                      // applying batches in sequence
	Recovering                // a gap is being filled from the replay endpoint
	Disconnected              // the publisher connection is gone, or the peer is not a ZMQ publisher; entries kept
	Stale                     // entries retracted, later messages ignored (for a while, or until registered again)
	Stopped                   // Stop returned; entries retracted
)

// String returns the lower-case state name used in logs and listings.
func (s State) String() string {
	switch s {
	case Connecting:
		return "connecting"
	case Connected:
		return "connected"
	case Live:
		return "live"
	case Recovering:
		return "recovering"
	case Disconnected:
		return "disconnected"
	case Stale:
		return "stale"
	case Stopped:
		return "stopped"
	}
	return fmt.Sprintf("State(%d)", int32(s))
}

// numStates is how many States there are.
const numStates = int(Stopped) + 1

// States returns every state in order, for listings and for metrics that
// export each state from start-up.
func States() [numStates]State {
	return [...]State{Connecting, Connected, Live, Recovering, Disconnected, Stale, Stopped}
}
