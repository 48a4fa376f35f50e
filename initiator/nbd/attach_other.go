//go:build !linux

package nbd

import (
	"errors"
	"fmt"
)

// Attachment is a Device attached to a kernel NBD device: Linux only.
type Attachment struct{}

// Attach needs Linux's nbd driver.
func Attach(dev string, d Device) (*Attachment, error) {
	return nil, fmt.Errorf("attach %s: %w", dev, errors.ErrUnsupported)
}

// Detach does nothing.
func (a *Attachment) Detach() error { return nil }
