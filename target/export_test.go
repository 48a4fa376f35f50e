package target

// StoreError is what the store adapter returns for err from the store
// operation op ("read", "write", "writezeroes", "deallocate", "flush"):
// for tests that inject a store's failure behind another backend.
func StoreError(op string, err error) error {
	ops := map[string]ioOp{"read": opRead, "write": opWrite, "writezeroes": opWriteZeroes,
		"deallocate": opDeallocate, "flush": opFlush}
	o, ok := ops[op]
	if !ok {
		return err
	}
	return storeError(o, err)
}
