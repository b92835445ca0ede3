package racebuild

import (
	"runtime/debug"
	"testing"
)

// Enabled says what the toolchain recorded about this very build.
func TestEnabledMatchesBuild(t *testing.T) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Skip("no build info in this binary")
	}
	race := false
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			race = s.Value == "true"
		}
	}
	if Enabled != race {
		t.Errorf("Enabled = %v, but the build's -race setting is %v", Enabled, race)
	}
}
