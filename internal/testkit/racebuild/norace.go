//go:build !race

package racebuild

// Enabled is false: this build has no race detector.
const Enabled = false
