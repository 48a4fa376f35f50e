package target

// VolumeError is what the volume adapter returns for err from the volume
// operation op ("read", "write", "writezeroes", "deallocate", "flush"):
// for tests that inject a volume's failure behind another backend.
func VolumeError(op string, err error) error {
	ops := map[string]ioOp{"read": opRead, "write": opWrite, "writezeroes": opWriteZeroes,
		"deallocate": opDeallocate, "flush": opFlush}
	o, ok := ops[op]
	if !ok {
		return err
	}
	return volumeError(o, err)
}
