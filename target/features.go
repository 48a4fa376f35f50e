package target

import (
	"github.com/blk-project/blk/nvme"
)

// Features a controller serves. Any other FID is Invalid Field, as nvmet.
//
//	0x01, 0x02, 0x04, 0x05             features_ctrl.go
//	0x06 Volatile Write Cache    get: 1 (enabled); not changeable
//	0x07 Number of Queues        min(asked, the controller's
//	                             Limits.MaxIOQueues) each
//	0x08 Interrupt Coalescing    stored; applied through the admin
//	                             queue's QueueParams.Coalescing
//	0x0B Async Event Config      the OAES bits
//	0x0F Keep Alive Timer        KATO in ms, rounded up to seconds
//	0x81 Host Identifier         get with EXHID: Connect's HOSTID (resv_cmd.go)
//	0x82 Resv Notification Mask  per controller; with a keeper only
//	0x83 Resv Persistence        PTPL, set through the keeper; with a keeper only
//
// A discovery controller serves only 0x0B and 0x0F.

// setFeatures serves Set Features.
func (c *ctrl) setFeatures(r *Request) nvme.Status {
	if r.Len != 0 {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	var f nvme.FeatureCommand
	f.Decode(&r.Cmd)
	if !c.featureServed(f.FID) {
		return nvme.StatusInvalidField.WithDNR()
	}
	if f.SV {
		return nvme.StatusFeatureNotSaveable.WithDNR()
	}
	if ctrlFeature(f.FID) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.setCtrlFeature(f.FID, f.CDW11)
	}
	switch f.FID {
	case nvme.FeatureVolatileWC:
		return nvme.StatusFeatureNotChangable.WithDNR()
	case nvme.FeatureNumQueues:
		return c.setNumQueues(r, f.CDW11)
	case nvme.FeatureIRQCoalescing:
		return c.setCoalescing(r, f.CDW11)
	case nvme.FeatureAsyncEventConfig:
		c.mu.Lock()
		c.aec = f.CDW11 & (c.oaes() | nvme.AENSMARTMask)
		r.Rsp.DW0 = c.aec
		c.mu.Unlock()
	case nvme.FeatureKeepAliveTimer:
		c.mu.Lock()
		c.setKATO(f.CDW11)
		c.mu.Unlock()
	}
	return nvme.StatusSuccess
}

// featureServed reports whether the controller serves a feature.
func (c *ctrl) featureServed(fid uint8) bool {
	switch fid {
	case nvme.FeatureAsyncEventConfig, nvme.FeatureKeepAliveTimer:
		return true
	case nvme.FeatureVolatileWC, nvme.FeatureNumQueues, nvme.FeatureIRQCoalescing, nvme.FeatureHostID:
		return !c.disc
	case nvme.FeatureResvMask, nvme.FeatureResvPersist:
		return !c.disc && c.s.reservationsServed()
	}
	return ctrlFeature(fid) && !c.disc
}

// setNumQueues grants I/O queues: as many as asked, up to the MaxIOQueues
// of the controller's transport port, for submission and completion queues separately. The DW0
// of the completion is the grant. Once an I/O queue is connected the
// grant cannot change.
func (c *ctrl) setNumQueues(r *Request, v uint32) nvme.Status {
	if v&0xFFFF == 0xFFFF || v>>16 == 0xFFFF {
		return nvme.StatusInvalidField.WithDNR()
	}
	nsq, ncq := nvme.SplitNumQueues(v)
	limit := uint32(c.lim.MaxIOQueues)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.nioq > 0 {
		return nvme.StatusCommandSequenceError.WithDNR()
	}
	c.nsqa, c.ncqa = min(nsq, limit), min(ncq, limit)
	r.Rsp.DW0 = nvme.NumQueues(c.nsqa, c.ncqa)
	return nvme.StatusSuccess
}

// setCoalescing stores Interrupt Coalescing and applies it through the
// admin queue's QueueParams.Coalescing, if the binding gave one; the
// binding applies it to whatever completion path it moderates. A binding
// error fails the command with Invalid Field and leaves the old value.
func (c *ctrl) setCoalescing(r *Request, v uint32) nvme.Status {
	v &= 0xFFFF
	if apply := c.admin.params.Coalescing; apply != nil {
		thr, tm := nvme.InterruptCoalescing(v)
		if err := apply(thr, tm); err != nil {
			c.t.logf("target: controller %d: interrupt coalescing %#04x: %v", c.cntlid, v, err)
			return nvme.StatusInvalidField.WithDNR()
		}
	}
	c.mu.Lock()
	c.coalescing = v
	c.mu.Unlock()
	return nvme.StatusSuccess
}

// getFeatures serves Get Features: the current value (SEL 0), the default
// (SEL 1, and SEL 2: nothing is saveable, so the saved value is the
// default), or the capabilities (SEL 3).
func (c *ctrl) getFeatures(r *Request) nvme.Status {
	if r.Len != 0 {
		return nvme.StatusSGLInvalidDataLength.WithDNR()
	}
	var f nvme.FeatureCommand
	f.Decode(&r.Cmd)
	if !c.featureServed(f.FID) {
		return nvme.StatusInvalidField.WithDNR()
	}
	if f.SEL > nvme.FeatureSelSupported {
		return nvme.StatusInvalidField.WithDNR()
	}
	if f.SEL == nvme.FeatureSelSupported {
		switch {
		case ctrlFeature(f.FID):
			r.Rsp.DW0 = ctrlFeatureCaps(f.FID)
		case f.FID != nvme.FeatureVolatileWC:
			r.Rsp.DW0 = nvme.FeatureCapChangeable
		}
		return nvme.StatusSuccess
	}
	def := f.SEL != nvme.FeatureSelCurrent
	l := &c.lim
	c.mu.Lock()
	defer c.mu.Unlock()
	switch f.FID {
	case nvme.FeatureArbitration, nvme.FeaturePowerManagement, nvme.FeatureTempThreshold, nvme.FeatureErrorRecovery:
		return c.getCtrlFeature(f.FID, f.CDW11, def, r)
	case nvme.FeatureVolatileWC:
		r.Rsp.DW0 = 1
	case nvme.FeatureNumQueues:
		if def {
			r.Rsp.DW0 = nvme.NumQueues(uint32(l.MaxIOQueues), uint32(l.MaxIOQueues))
		} else {
			r.Rsp.DW0 = nvme.NumQueues(c.nsqa, c.ncqa)
		}
	case nvme.FeatureIRQCoalescing:
		if !def {
			r.Rsp.DW0 = c.coalescing
		}
	case nvme.FeatureAsyncEventConfig:
		if def {
			r.Rsp.DW0 = newCtrlAEC(c.disc, c.s.ana)
		} else {
			r.Rsp.DW0 = c.aec
		}
	case nvme.FeatureKeepAliveTimer:
		if !def {
			r.Rsp.DW0 = uint32(c.kato.Milliseconds())
		}
	}
	return nvme.StatusSuccess
}

// newCtrlAEC is the Asynchronous Event Configuration a controller starts
// with: namespace attribute notices on for an I/O controller, and ANA
// change notices too for a subsystem with ANA (nvmet's
// NVMET_AEN_CFG_OPTIONAL), nothing for a discovery controller until the
// host asks.
func newCtrlAEC(disc, ana bool) uint32 {
	switch {
	case disc:
		return 0
	case ana:
		return nvme.AENNSAttr | nvme.AENANAChange
	}
	return nvme.AENNSAttr
}
