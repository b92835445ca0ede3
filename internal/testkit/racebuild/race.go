//go:build race

package racebuild

// Enabled is true: this build has the race detector.
const Enabled = true
