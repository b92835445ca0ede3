//go:build race

package main

// raceEnabled: the tests run under the race detector, so TestSoakShort
// builds the server with it too. The race build of every server package is
// then already in the build cache (CI runs go test -race ./...), and the
// soak doubles as a race hunt in the server under churn.
const raceEnabled = true
