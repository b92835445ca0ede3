//go:build race

package subscriber

// raceEnabled skips allocation counts, which the race detector inflates.
const raceEnabled = true
