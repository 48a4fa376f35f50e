package nvme

// FeatureCommand holds the fields of a Get Features (opcode 0x0A) or Set
// Features (opcode 0x09) command.
//
//	bytes 4-7 NSID
//	CDW10     FID 7:0; Get: SEL 10:8; Set: SV 31
//	CDW11     feature specific value (Set), or a feature specific
//	          argument (Get)
//	CDW12-15  feature specific
type FeatureCommand struct {
	NSID  uint32
	FID   uint8
	SEL   uint8 // Get Features only
	SV    bool  // Set Features only
	CDW11 uint32
}

// Get Features SEL values.
const (
	FeatureSelCurrent   uint8 = 0
	FeatureSelDefault   uint8 = 1
	FeatureSelSaved     uint8 = 2
	FeatureSelSupported uint8 = 3
)

// Capabilities a Get Features with SEL 3 reports in DW0.
const (
	FeatureCapSaveable   uint32 = 1 << 0
	FeatureCapNSSpecific uint32 = 1 << 1
	FeatureCapChangeable uint32 = 1 << 2
)

// Decode reads the feature fields from c (whatever its opcode; SEL and SV
// are both decoded).
func (f *FeatureCommand) Decode(c *Command) {
	f.NSID = c.NSID
	f.FID = uint8(c.CDW10)
	f.SEL = uint8(c.CDW10>>8) & 7
	f.SV = c.CDW10&(1<<31) != 0
	f.CDW11 = c.CDW11
}

// EncodeGet writes a Get Features command into c, leaving CID, flags and
// DPTR as they are.
func (f *FeatureCommand) EncodeGet(c *Command) {
	c.Opcode = uint8(AdminGetFeatures)
	c.NSID = f.NSID
	c.CDW10 = uint32(f.FID) | uint32(f.SEL&7)<<8
	c.CDW11 = f.CDW11
}

// EncodeSet writes a Set Features command into c, leaving CID, flags and
// DPTR as they are.
func (f *FeatureCommand) EncodeSet(c *Command) {
	c.Opcode = uint8(AdminSetFeatures)
	c.NSID = f.NSID
	c.CDW10 = uint32(f.FID)
	if f.SV {
		c.CDW10 |= 1 << 31
	}
	c.CDW11 = f.CDW11
}

// NumQueues encodes the Number of Queues feature value (CDW11 of Set
// Features, DW0 of its completion): the 0's based submission queue count
// in bits 15:0 and completion queue count in bits 31:16, from 1's based
// counts (1..65535).
func NumQueues(nsq, ncq uint32) uint32 {
	return (nsq-1)&0xFFFF | (ncq-1)<<16
}

// SplitNumQueues returns the 1's based counts of a Number of Queues value.
func SplitNumQueues(v uint32) (nsq, ncq uint32) {
	return v&0xFFFF + 1, v>>16 + 1
}

// InterruptCoalescing splits the Interrupt Coalescing feature value:
// aggregation threshold (bits 7:0, 0's based completions) and aggregation
// time (bits 15:8, 100 µs units).
func InterruptCoalescing(v uint32) (threshold, time100us uint8) {
	return uint8(v), uint8(v >> 8)
}
