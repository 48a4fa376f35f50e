package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// stageRecord is what NodeStageVolume did for one volume on this node,
// kept in STATE-DIR/staged/<volume>.json so that a restarted plugin (or
// node) knows what to undo and converge to (§1.10). It is written before
// the first kernel operation of a stage and again after each step, so a
// plugin killed half way still finds what it started. Secrets are never
// written here (§1.7).
type stageRecord struct {
	VolumeID    string   `json:"volume_id"`
	Transport   string   `json:"transport"` // "tcp" or "nbd"
	SubNQN      string   `json:"subnqn"`
	NSID        uint32   `json:"nsid,omitempty"`
	Endpoints   []string `json:"endpoints"`        // host:port, the publish context's
	Auth        bool     `json:"auth"`             // DH-HMAC-CHAP was used (secrets are not kept)
	Device      string   `json:"device,omitempty"` // "" until connected
	Block       bool     `json:"block"`
	FSType      string   `json:"fs_type,omitempty"`
	MountFlags  []string `json:"mount_flags,omitempty"`
	AccessMode  string   `json:"access_mode"`
	StagingPath string   `json:"staging_path"`
	// Targets are the paths the volume is published at (NodePublish).
	Targets []publishedTarget `json:"targets,omitempty"`
	// Complete is set when NodeStageVolume succeeded; an incomplete
	// record (a stage that failed half way) may be staged over with
	// another capability.
	Complete bool      `json:"complete"`
	StagedAt time.Time `json:"staged_at"`
}

// publishedTarget is one NodePublishVolume's target.
type publishedTarget struct {
	Path       string `json:"path"`
	ReadOnly   bool   `json:"readonly"`
	AccessMode string `json:"access_mode"`
}

func (r *stageRecord) target(path string) (publishedTarget, bool) {
	for _, t := range r.Targets {
		if t.Path == path {
			return t, true
		}
	}
	return publishedTarget{}, false
}

func (r *stageRecord) addTarget(t publishedTarget) {
	r.dropTarget(t.Path)
	r.Targets = append(r.Targets, t)
	sort.Slice(r.Targets, func(i, j int) bool { return r.Targets[i].Path < r.Targets[j].Path })
}

func (r *stageRecord) dropTarget(path string) {
	r.Targets = slices.DeleteFunc(r.Targets, func(t publishedTarget) bool { return t.Path == path })
}

// stateDir holds the staging records. Calls on one volume are serialised
// by the driver's per-ID lock, so the store needs no lock of its own.
type stateDir struct {
	dir string // STATE-DIR/staged
}

func openStateDir(root string) (*stateDir, error) {
	if root == "" {
		return nil, errors.New("csi: node mode needs a state directory (--state-dir)")
	}
	dir := filepath.Join(root, "staged")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("csi: state directory: %w", err)
	}
	return &stateDir{dir: dir}, nil
}

// plainName is a volume ID usable as a file name as it is: blk's name
// grammar, which every ID the controller hands out follows.
var plainName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// file names the record of a volume. IDs outside blk's name grammar (a
// CO may send anything) are hashed, so no ID can escape the directory.
func (s *stateDir) file(volumeID string) string {
	name := volumeID
	if !plainName.MatchString(name) {
		sum := sha256.Sum256([]byte(volumeID))
		name = "x-" + hex.EncodeToString(sum[:16])
	}
	return filepath.Join(s.dir, name+".json")
}

// load returns the volume's record, or nil if there is none.
func (s *stateDir) load(volumeID string) (*stageRecord, error) {
	b, err := os.ReadFile(s.file(volumeID))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the staging record of %s: %w", volumeID, err)
	}
	var r stageRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("staging record %s: %w", s.file(volumeID), err)
	}
	if r.VolumeID != volumeID {
		return nil, fmt.Errorf("staging record %s is of volume %q, not %q", s.file(volumeID), r.VolumeID, volumeID)
	}
	return &r, nil
}

// save writes the record durably: a temporary file, fsync, rename, fsync
// of the directory.
func (s *stateDir) save(r *stageRecord) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	final := s.file(r.VolumeID)
	tmp, err := os.CreateTemp(s.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("writing the staging record of %s: %w", r.VolumeID, err)
	}
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), final)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the staging record of %s: %w", r.VolumeID, err)
	}
	return s.syncDir()
}

// remove deletes the volume's record; none is no error.
func (s *stateDir) remove(volumeID string) error {
	if err := os.Remove(s.file(volumeID)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing the staging record of %s: %w", volumeID, err)
	}
	return s.syncDir()
}

func (s *stateDir) syncDir() error {
	d, err := os.Open(s.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// all returns every record, sorted by volume ID. A record that cannot be
// read is reported in the error and skipped, so one bad file does not
// hide the others.
func (s *stateDir) all() ([]*stageRecord, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var recs []*stageRecord
	var errs []error
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r stageRecord
		if err := json.Unmarshal(b, &r); err != nil || r.VolumeID == "" {
			errs = append(errs, fmt.Errorf("staging record %s: unreadable (%v)", e.Name(), err))
			continue
		}
		recs = append(recs, &r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].VolumeID < recs[j].VolumeID })
	return recs, errors.Join(errs...)
}

// writable checks that a record could be written now (Probe).
func (s *stateDir) writable() error {
	f, err := os.CreateTemp(s.dir, ".probe-*")
	if err != nil {
		return fmt.Errorf("state directory %s is not writable: %w", s.dir, err)
	}
	f.Close()
	return os.Remove(f.Name())
}
