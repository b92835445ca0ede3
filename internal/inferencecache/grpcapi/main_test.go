package grpcapi

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: every
// server, stream and watcher must be stopped by its owner.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
