//go:build race

package soft

func init() { raceEnabled = true }
