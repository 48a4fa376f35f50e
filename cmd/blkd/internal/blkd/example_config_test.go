package blkd

import "testing"

// TestExampleConfig: deploy/blkd.example.json loads (no unknown field)
// and validates: the file operators copy must not be stale.
func TestExampleConfig(t *testing.T) {
	c, err := LoadConfigFile("../../../../deploy/blkd.example.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if !c.TCPOn() || !c.RDMAOn() || !c.WithDefaults().DiscoveryOn() {
		t.Errorf("the example serves NVMe/TCP %v, NVMe/RDMA %v, discovery %v; want all three", c.TCPOn(), c.RDMAOn(), c.WithDefaults().DiscoveryOn())
	}
}
