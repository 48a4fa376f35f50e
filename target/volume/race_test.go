//go:build race

package volume

const raceEnabled = true
