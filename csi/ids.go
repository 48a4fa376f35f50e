package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/blk-project/blk/api"
)

// Identifiers (docs/operations.md §1.4).
//
// A volume ID is the blk volume's name. A CSI name (the provisioner's
// pvc-<uuid>) is used as is when blk's name grammar accepts it, else
// hashed: the same CSI name must always give the same volume, or a
// repeated CreateVolume would make a second one.
//
// A snapshot ID is VOLUME/SNAPSHOT: blk names snapshots per volume, CSI
// per driver, and '/' is outside the name grammar, so the split is
// unambiguous.

// hashedPrefix starts a volume or snapshot name made from a CSI name the
// grammar refuses.
const hashedPrefix = "csi-"

// blkName maps a CSI name to a blk name: itself when api.CheckName
// accepts it, else "csi-" and the first 32 hex digits of its SHA-256.
func blkName(csiName string) string {
	if api.CheckName("name", csiName) == nil {
		return csiName
	}
	sum := sha256.Sum256([]byte(csiName))
	return hashedPrefix + hex.EncodeToString(sum[:16])
}

// errBadID is a malformed volume or snapshot ID.
var errBadID = errors.New("malformed ID")

// checkVolumeID checks that id can be a blk volume's name.
func checkVolumeID(id string) error {
	if err := api.CheckName("volume ID", id); err != nil {
		return fmt.Errorf("%w: %v", errBadID, err)
	}
	return nil
}

// snapshotID is the CSI ID of blk snapshot snap of volume vol.
func snapshotID(vol, snap string) string { return vol + "/" + snap }

// parseSnapshotID splits a snapshot ID into its volume and snapshot names.
func parseSnapshotID(id string) (vol, snap string, err error) {
	vol, snap, ok := strings.Cut(id, "/")
	if !ok {
		return "", "", fmt.Errorf("%w: snapshot ID %q is not VOLUME/SNAPSHOT", errBadID, id)
	}
	if err := api.CheckName("volume", vol); err != nil {
		return "", "", fmt.Errorf("%w: snapshot ID %q: %v", errBadID, id, err)
	}
	if err := api.CheckName("snapshot", snap); err != nil {
		return "", "", fmt.Errorf("%w: snapshot ID %q: %v", errBadID, id, err)
	}
	return vol, snap, nil
}
