//go:build race

package target_test

const raceEnabled = true
