//go:build race

package main

// raceEnabled: the race detector multiplies time and memory, so the
// flood runs smaller under it.
const raceEnabled = true
