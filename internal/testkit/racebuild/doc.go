// Package racebuild reports whether the binary was built with the race
// detector (-race), so tests can skip what it distorts (allocation counts:
// sync.Pool drops items at random under it) and shrink what it slows
// (floods: it multiplies time and memory). One constant in one place,
// instead of a pair of build-tagged files in every package that asks.
package racebuild
