package target

import "github.com/blk-project/blk/nvme"

// The controller features a host's identify reads (docs/reservations.md
// §4.2; SPDK's spdk_nvme_identify asks for all four, and skips its Health
// Information section when 04h fails). Each has Get (current, default,
// saved = default: nothing is saveable; capabilities) and Set, per
// controller, as nvmf_tgt keeps them:
//
//	0x01 Arbitration           stored as set (default 0: round robin,
//	                           burst 1); one arbitration serves every
//	                           queue (the poll group's order), so any
//	                           value is accepted
//	0x02 Power Management      PS 0 only (one power state, PSD0) and WH 0
//	                           (no workload hints): anything else is
//	                           Invalid Field
//	0x04 Temperature Threshold TMPSEL 0 (the composite temperature) only;
//	                           THSEL 0 over (default 0157h, 343 K, 70 °C)
//	                           and 1 under (default 0); the SMART log's
//	                           critical warning bit 1 follows them
//	0x05 Error Recovery        TLER stored as set (no limit is enforced:
//	                           a command never retries internally);
//	                           DULBE 1 Invalid Field (NSFEAT does not say
//	                           deallocated blocks error); namespace
//	                           specific: on a path whose ANA state serves
//	                           no I/O, that state's path status

// ctrlFeatures are one controller's values of the features above,
// guarded by ctrl.mu.
type ctrlFeatures struct {
	arbitration         uint32
	tempOver, tempUnder uint16 // kelvin
	tler                uint16 // 100 ms units
}

const (
	// defaultTempOver is the over temperature threshold a controller
	// starts with: 343 K (70 °C), above smartTemperature, so the SMART
	// log raises no warning until a host sets a threshold it crosses.
	defaultTempOver = 0x157
	// smartTemperature is the composite temperature the SMART log
	// reports: 25 °C (a composite temperature of 0 K reads as -273 °C in
	// the host's hwmon). There is no sensor.
	smartTemperature = 273 + 25
)

// Temperature Threshold fields of CDW11.
const (
	thselOver  = 0
	thselUnder = 1
)

func newCtrlFeatures() ctrlFeatures { return ctrlFeatures{tempOver: defaultTempOver} }

// tempWarning says whether the composite temperature is at or beyond a
// threshold: the SMART log's critical warning bit 1. Requires c.mu.
func (f *ctrlFeatures) tempWarning() bool {
	return smartTemperature >= f.tempOver || smartTemperature <= f.tempUnder
}

// ctrlFeature reports whether fid is one of the features of this file:
// served by an I/O controller only.
func ctrlFeature(fid uint8) bool {
	switch fid {
	case nvme.FeatureArbitration, nvme.FeaturePowerManagement, nvme.FeatureTempThreshold, nvme.FeatureErrorRecovery:
		return true
	}
	return false
}

// tempSelect reads TMPSEL and THSEL of a Temperature Threshold CDW11:
// false for another sensor than the composite (1–8, Fh for all) or a
// reserved THSEL.
func tempSelect(cdw11 uint32) (under, ok bool) {
	tmpsel, thsel := (cdw11>>16)&0xF, (cdw11>>20)&3
	return thsel == thselUnder, tmpsel == 0 && thsel <= thselUnder
}

// pathStatus is the status a namespace-specific feature gets on a path
// whose ANA state serves no I/O (as SPDK answers Error Recovery and the
// reservation features there), else success.
func (c *ctrl) pathStatus() nvme.Status { return nvme.Status(c.s.anaIO.Load()) }

// setCtrlFeature serves Set Features of one of this file's features.
// Requires c.mu.
func (c *ctrl) setCtrlFeature(fid uint8, v uint32) nvme.Status {
	f := &c.feat
	switch fid {
	case nvme.FeatureArbitration:
		f.arbitration = v
	case nvme.FeaturePowerManagement:
		if v&0xFF != 0 { // PS 4:0, WH 7:5
			return nvme.StatusInvalidField.WithDNR()
		}
	case nvme.FeatureTempThreshold:
		under, ok := tempSelect(v)
		if !ok {
			return nvme.StatusInvalidField.WithDNR()
		}
		if under {
			f.tempUnder = uint16(v)
		} else {
			f.tempOver = uint16(v)
		}
	case nvme.FeatureErrorRecovery:
		if st := c.pathStatus(); st != nvme.StatusSuccess {
			return st
		}
		if v&(1<<16) != 0 { // DULBE
			return nvme.StatusInvalidField.WithDNR()
		}
		f.tler = uint16(v)
	}
	return nvme.StatusSuccess
}

// getCtrlFeature serves Get Features of one of this file's features,
// SEL 0 to 2 (def: the default, which is also the saved value): the
// value in DW0. Requires c.mu.
func (c *ctrl) getCtrlFeature(fid uint8, cdw11 uint32, def bool, r *Request) nvme.Status {
	f := &c.feat
	if def {
		d := newCtrlFeatures()
		f = &d
	}
	switch fid {
	case nvme.FeatureArbitration:
		r.Rsp.DW0 = f.arbitration
	case nvme.FeaturePowerManagement:
		r.Rsp.DW0 = 0 // PS 0, WH 0
	case nvme.FeatureTempThreshold:
		under, ok := tempSelect(cdw11)
		switch {
		case !ok:
			return nvme.StatusInvalidField.WithDNR()
		case under:
			r.Rsp.DW0 = uint32(f.tempUnder)
		default:
			r.Rsp.DW0 = uint32(f.tempOver)
		}
	case nvme.FeatureErrorRecovery:
		if st := c.pathStatus(); st != nvme.StatusSuccess {
			return st
		}
		r.Rsp.DW0 = uint32(f.tler) // DULBE 0
	}
	return nvme.StatusSuccess
}

// ctrlFeatureCaps is what Get Features SEL 3 says of one of this file's
// features: changeable; Error Recovery also namespace specific.
func ctrlFeatureCaps(fid uint8) uint32 {
	if fid == nvme.FeatureErrorRecovery {
		return nvme.FeatureCapChangeable | nvme.FeatureCapNSSpecific
	}
	return nvme.FeatureCapChangeable
}
