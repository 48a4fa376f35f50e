package store

// Exported for the external test package (fixture_test.go).

var FillTagged = fillTagged

const FixtureDir = fixtureDir

type FixtureOp = fixtureOp

var FixtureOps = fixtureOps
