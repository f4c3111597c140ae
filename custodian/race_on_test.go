//go:build race

package custodian

// raceEnabled: this test binary runs under the race detector.
const raceEnabled = true
