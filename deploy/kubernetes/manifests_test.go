package kubernetes

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/blk-project/blk/csi"
)

// What these checks compare the manifests with, beyond the manifests
// themselves: the driver's name (csi.DriverName), the StorageClass
// parameters (docs/operations.md §1.6), blk-csi's flags (§1.2), blkd's
// flags and variables (cmd/blkd/main.go), the image's Containerfile.

// designParameterKeys is §1.6's list of StorageClass parameters.
var designParameterKeys = []string{
	"replicas", "blockSize", "transport", "fsType", "mkfsOptions",
	"zoneLocal", "flattenClones", "authentication",
}

// parameterKeys is what the StorageClasses may set.
// MERGE(i26ctl): replace designParameterKeys with csi.Parameters on this line once csi/params.go is on main.
var parameterKeys = designParameterKeys

// parameterValues are §1.6's values of the parameters that take a fixed
// set (the others are checked by the driver: replicas 1–5, mkfsOptions).
var parameterValues = map[string][]string{
	"blockSize":      {"512", "4096"},
	"transport":      {"tcp", "nbd", "tcp,nbd"},
	"fsType":         {"ext4", "xfs"},
	"zoneLocal":      {"true", "false"},
	"flattenClones":  {"true", "false"},
	"authentication": {"none", "dhchap"},
	// The sidecars' key for the filesystem, which wins over fsType.
	"csi.storage.k8s.io/fstype": {"ext4", "xfs"},
}

// blkCSIFlags are cmd/blk-csi's flags (§1.2, and --tls-name, --host-id
// of csi.Config).
var blkCSIFlags = []string{
	"endpoint", "mode", "api", "tls-dir", "tls-name", "node-name", "host-nqn",
	"host-id", "zone", "state-dir", "log-level", "log-format",
}

// The files blk-csi reads from --tls-dir (blkctl's names for an operator's
// certificate, §1.7) and blkd from its --tls-dir besides NODE.crt/.key.
var (
	csiTLSKeys  = []string{"ca.crt", "operator.crt", "operator.key"}
	blkdTLSKeys = []string{"ca.crt"}
)

type object struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec        objSpec           `json:"spec"`
	Provisioner string            `json:"provisioner"` // StorageClass
	Parameters  map[string]string `json:"parameters"`  // StorageClass
	Driver      string            `json:"driver"`      // VolumeSnapshotClass
	Data        map[string]string `json:"data"`        // ConfigMap, Secret
	StringData  map[string]string `json:"stringData"`  // Secret
	Subjects    []struct {
		Kind      string `json:"kind"`
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"subjects"` // RoleBinding, ClusterRoleBinding
	RoleRef struct {
		Kind string `json:"kind"`
		Name string `json:"name"`
	} `json:"roleRef"`

	file string
}

type objSpec struct {
	Template *struct {
		Spec podSpec `json:"spec"`
	} `json:"template"` // Deployment, DaemonSet
	podSpec               // Pod
	Ports   []servicePort `json:"ports"` // Service
}

type podSpec struct {
	ServiceAccountName string      `json:"serviceAccountName"`
	HostNetwork        bool        `json:"hostNetwork"`
	DNSPolicy          string      `json:"dnsPolicy"`
	Containers         []container `json:"containers"`
	Volumes            []volume    `json:"volumes"`
}

type servicePort struct {
	Port       int `json:"port"`
	TargetPort int `json:"targetPort"`
}

type container struct {
	Name         string   `json:"name"`
	Image        string   `json:"image"`
	Command      []string `json:"command"`
	Args         []string `json:"args"`
	Env          []envVar `json:"env"`
	VolumeMounts []struct {
		Name      string `json:"name"`
		MountPath string `json:"mountPath"`
	} `json:"volumeMounts"`
	Ports []struct {
		Name          string `json:"name"`
		ContainerPort int    `json:"containerPort"`
	} `json:"ports"`
	StartupProbe   *probe `json:"startupProbe"`
	LivenessProbe  *probe `json:"livenessProbe"`
	ReadinessProbe *probe `json:"readinessProbe"`
}

type envVar struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	ValueFrom *struct {
		ConfigMapKeyRef *struct {
			Name string `json:"name"`
			Key  string `json:"key"`
		} `json:"configMapKeyRef"`
	} `json:"valueFrom"`
}

type probe struct {
	HTTPGet *struct {
		Path   string `json:"path"`
		Port   any    `json:"port"`
		Scheme string `json:"scheme"`
	} `json:"httpGet"`
}

type volume struct {
	Name     string `json:"name"`
	HostPath *struct {
		Path string `json:"path"`
	} `json:"hostPath"`
	Secret *struct {
		SecretName string `json:"secretName"`
	} `json:"secret"`
}

// pod is the pod spec of a workload or a Pod, nil for other kinds.
func (o *object) pod() *podSpec {
	switch o.Kind {
	case "Deployment", "DaemonSet", "StatefulSet":
		if o.Spec.Template != nil {
			return &o.Spec.Template.Spec
		}
	case "Pod":
		return &o.Spec.podSpec
	}
	return nil
}

func (o *object) String() string { return o.file + ": " + o.Kind + " " + o.Metadata.Name }

// set is everything the checks read.
type set struct {
	objs          []*object
	images        map[string]string // images.env
	containerfile string
	blkdMain      string // cmd/blkd/main.go, for its flags
}

// load reads the manifests (the applied ones and examples/), images.env,
// the Containerfile and blkd's flags, from the repository.
func load(t *testing.T) *set {
	t.Helper()
	s := &set{images: map[string]string{}}
	files, _ := filepath.Glob("*.yaml")
	ex, _ := filepath.Glob("examples/*.yaml")
	files = append(files, ex...)
	if len(files) < 10 {
		t.Fatalf("only %d manifests found: %v", len(files), files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := parse(f, b)
		if err != nil {
			t.Fatal(err)
		}
		s.objs = append(s.objs, objs...)
	}
	b, err := os.ReadFile("images.env")
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || v == "" {
			t.Fatalf("images.env: %q is not NAME=IMAGE", line)
		}
		s.images[k] = v
	}
	for name, p := range map[string]*string{
		"../container/Containerfile": &s.containerfile,
		"../../cmd/blkd/main.go":     &s.blkdMain,
	} {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		*p = string(b)
	}
	return s
}

// parse splits a YAML stream into its documents; a document of comments
// only is no object.
func parse(file string, b []byte) ([]*object, error) {
	var out []*object
	for i, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(b), -1) {
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i+1, err)
		}
		if o.Kind == "" {
			if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) != "" {
				return nil, fmt.Errorf("%s: document %d has no kind", file, i+1)
			}
			continue
		}
		o.file = file
		out = append(out, &o)
	}
	return out, nil
}

func (s *set) find(kind, name string) *object {
	for _, o := range s.objs {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	return nil
}

func (s *set) containers(visit func(o *object, p *podSpec, c *container)) {
	for _, o := range s.objs {
		if p := o.pod(); p != nil {
			for i := range p.Containers {
				visit(o, p, &p.Containers[i])
			}
		}
	}
}

// flag returns the value of --name=V or --name V in args.
func flag(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

func (p *podSpec) volume(name string) *volume {
	for i := range p.Volumes {
		if p.Volumes[i].Name == name {
			return &p.Volumes[i]
		}
	}
	return nil
}

// mountAt is the volume a container mounts at dir.
func (c *container) mountAt(dir string) string {
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) == path.Clean(dir) {
			return m.Name
		}
	}
	return ""
}

// blkdScript is the shell script of 30-blkd.yaml's container, or "".
func (c *container) script() string {
	if len(c.Command) >= 2 && path.Base(c.Command[0]) == "sh" && c.Command[len(c.Command)-1] == "-c" && len(c.Args) > 0 {
		return c.Args[0]
	}
	return ""
}

// program is the binary a container runs: its command, or the one its
// shell script execs.
func (c *container) program() string {
	if sc := c.script(); sc != "" {
		if m := regexp.MustCompile(`(?m)^\s*exec\s+(\S+)`).FindStringSubmatch(sc); m != nil {
			return path.Base(m[1])
		}
		return ""
	}
	if len(c.Command) > 0 {
		return path.Base(c.Command[0])
	}
	return ""
}

func (s *set) checkImages() []error {
	var errs []error
	used := map[string]bool{}
	pinned := map[string]bool{}
	for _, img := range s.images {
		pinned[img] = true
	}
	s.containers(func(o *object, _ *podSpec, c *container) {
		if strings.HasPrefix(o.file, "examples/") {
			return // the user's pods
		}
		used[c.Image] = true
		if !pinned[c.Image] {
			errs = append(errs, fmt.Errorf("%s: container %s runs %s, which images.env does not pin", o, c.Name, c.Image))
		}
	})
	for name, img := range s.images {
		_, tag, ok := strings.Cut(path.Base(img), ":")
		if !ok || tag == "" || tag == "latest" {
			errs = append(errs, fmt.Errorf("images.env: %s=%s has no pinned tag", name, img))
		}
		if !used[img] {
			errs = append(errs, fmt.Errorf("images.env: %s=%s is used by no manifest", name, img))
		}
	}
	return errs
}

// checkDriverName: every place that names the driver names csi.DriverName.
func (s *set) checkDriverName() []error {
	var errs []error
	n := 0
	for _, o := range s.objs {
		var got string
		switch o.Kind {
		case "CSIDriver":
			got = o.Metadata.Name
		case "StorageClass":
			got = o.Provisioner
		case "VolumeSnapshotClass":
			got = o.Driver
		default:
			continue
		}
		n++
		if got != csi.DriverName {
			errs = append(errs, fmt.Errorf("%s names the driver %q, not %q", o, got, csi.DriverName))
		}
	}
	if s.find("CSIDriver", csi.DriverName) == nil {
		errs = append(errs, fmt.Errorf("no CSIDriver %s", csi.DriverName))
	}
	if n < 3 {
		errs = append(errs, fmt.Errorf("only %d CSIDriver, StorageClass and VolumeSnapshotClass objects", n))
	}
	return errs
}

// checkSockets: blk-csi's --endpoint and every sidecar's --csi-address are
// one path on one volume; on the node, that volume is kubelet's plugin
// directory for this driver and the registrar tells kubelet that path.
func (s *set) checkSockets() []error {
	var errs []error
	pods := 0
	for _, o := range s.objs {
		p := o.pod()
		if p == nil {
			continue
		}
		var drv *container
		for i := range p.Containers {
			if p.Containers[i].program() == "blk-csi" {
				drv = &p.Containers[i]
			}
		}
		if drv == nil {
			continue
		}
		pods++
		ep, _ := flag(drv.Args, "endpoint")
		sock, ok := strings.CutPrefix(ep, "unix://")
		if !ok || !path.IsAbs(sock) {
			errs = append(errs, fmt.Errorf("%s: blk-csi --endpoint %q is not unix:///PATH", o, ep))
			continue
		}
		dir := path.Dir(sock)
		vol := drv.mountAt(dir)
		if vol == "" {
			errs = append(errs, fmt.Errorf("%s: blk-csi mounts no volume at %s, its socket's directory", o, dir))
		}
		sidecars := 0
		for i := range p.Containers {
			c := &p.Containers[i]
			addr, ok := flag(c.Args, "csi-address")
			if !ok {
				continue
			}
			sidecars++
			if addr != sock {
				errs = append(errs, fmt.Errorf("%s: %s --csi-address=%s, blk-csi listens on %s", o, c.Name, addr, sock))
			}
			if got := c.mountAt(dir); got != vol {
				errs = append(errs, fmt.Errorf("%s: %s mounts %q at %s, blk-csi %q", o, c.Name, got, dir, vol))
			}
			reg, ok := flag(c.Args, "kubelet-registration-path")
			if !ok {
				continue
			}
			v := p.volume(vol)
			want := "/var/lib/kubelet/plugins/" + csi.DriverName
			if v == nil || v.HostPath == nil || path.Clean(v.HostPath.Path) != want {
				errs = append(errs, fmt.Errorf("%s: the socket's volume %q is not the host's %s", o, vol, want))
			} else if reg != path.Join(v.HostPath.Path, path.Base(sock)) {
				errs = append(errs, fmt.Errorf("%s: --kubelet-registration-path=%s, the socket is the host's %s", o, reg, path.Join(v.HostPath.Path, path.Base(sock))))
			}
			if c.mountAt("/registration") == "" {
				errs = append(errs, fmt.Errorf("%s: %s mounts nothing at /registration", o, c.Name))
			}
		}
		if sidecars == 0 {
			errs = append(errs, fmt.Errorf("%s: no sidecar beside blk-csi", o))
		}
	}
	if pods != 2 {
		errs = append(errs, fmt.Errorf("%d pods run blk-csi, want 2 (controller and node)", pods))
	}
	return errs
}

// checkParameters: the StorageClasses set only §1.6's keys, with its
// values, and name the Secrets that authentication needs (§1.7).
func (s *set) checkParameters() []error {
	var errs []error
	for _, o := range s.objs {
		if o.Kind != "StorageClass" {
			continue
		}
		for k, v := range o.Parameters {
			if strings.HasPrefix(k, "csi.storage.k8s.io/") {
				if vals, ok := parameterValues[k]; ok && !slices.Contains(vals, v) {
					errs = append(errs, fmt.Errorf("%s: %s: %q is not one of %v", o, k, v, vals))
				}
				continue
			}
			if !slices.Contains(parameterKeys, k) {
				errs = append(errs, fmt.Errorf("%s: parameter %q is not the driver's (%v)", o, k, parameterKeys))
				continue
			}
			if vals, ok := parameterValues[k]; ok && !slices.Contains(vals, v) {
				errs = append(errs, fmt.Errorf("%s: %s: %q is not one of %v", o, k, v, vals))
			}
		}
		if o.Parameters["authentication"] != "dhchap" {
			continue
		}
		for _, use := range []string{"controller-publish", "node-stage"} {
			pre := "csi.storage.k8s.io/" + use + "-secret-"
			name, ns := o.Parameters[pre+"name"], o.Parameters[pre+"namespace"]
			if name == "" || ns == "" {
				errs = append(errs, fmt.Errorf("%s: authentication dhchap without %sname and %snamespace", o, pre, pre))
				continue
			}
			sec := s.find("Secret", name)
			if sec == nil || sec.Metadata.Namespace != ns {
				errs = append(errs, fmt.Errorf("%s: no Secret %s/%s in examples/secrets.yaml", o, ns, name))
			} else if _, ok := sec.StringData["dhchapSecret"]; !ok {
				errs = append(errs, fmt.Errorf("%s: Secret %s has no dhchapSecret", o, name))
			}
		}
	}
	return errs
}

// checkReferences: what pods mount, read and run as exists, with the keys
// it needs, in the pod's namespace; bindings bind what exists.
func (s *set) checkReferences() []error {
	var errs []error
	s.containers(func(o *object, p *podSpec, c *container) {
		for _, e := range c.Env {
			if e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil {
				continue
			}
			ref := e.ValueFrom.ConfigMapKeyRef
			cm := s.find("ConfigMap", ref.Name)
			if cm == nil || cm.Metadata.Namespace != o.Metadata.Namespace {
				errs = append(errs, fmt.Errorf("%s: %s reads ConfigMap %s, not in %s", o, c.Name, ref.Name, o.Metadata.Namespace))
			} else if _, ok := cm.Data[ref.Key]; !ok {
				errs = append(errs, fmt.Errorf("%s: %s reads key %s of ConfigMap %s, which has none", o, c.Name, ref.Key, ref.Name))
			}
		}
		tlsDir, ok := flag(c.Args, "tls-dir")
		if sc := c.script(); sc != "" {
			if m := regexp.MustCompile(`--tls-dir\s+(\S+)`).FindStringSubmatch(sc); m != nil {
				tlsDir, ok = m[1], true
			}
		}
		if !ok {
			return
		}
		want := csiTLSKeys
		if c.program() == "blkd" {
			want = blkdTLSKeys
		}
		v := p.volume(c.mountAt(tlsDir))
		if v == nil || v.Secret == nil {
			errs = append(errs, fmt.Errorf("%s: %s --tls-dir %s is no Secret's mount", o, c.Name, tlsDir))
			return
		}
		sec := s.find("Secret", v.Secret.SecretName)
		if sec == nil || sec.Metadata.Namespace != o.Metadata.Namespace {
			errs = append(errs, fmt.Errorf("%s: Secret %s is not in examples/secrets.yaml", o, v.Secret.SecretName))
			return
		}
		for _, k := range want {
			if _, ok := sec.StringData[k]; !ok {
				errs = append(errs, fmt.Errorf("%s: Secret %s has no %s for %s", o, sec.Metadata.Name, k, c.Name))
			}
		}
	})
	for _, o := range s.objs {
		if p := o.pod(); p != nil && p.ServiceAccountName != "" {
			if sa := s.find("ServiceAccount", p.ServiceAccountName); sa == nil || sa.Metadata.Namespace != o.Metadata.Namespace {
				errs = append(errs, fmt.Errorf("%s: no ServiceAccount %s in %s", o, p.ServiceAccountName, o.Metadata.Namespace))
			}
		}
		if o.Kind != "RoleBinding" && o.Kind != "ClusterRoleBinding" {
			continue
		}
		if s.find(o.RoleRef.Kind, o.RoleRef.Name) == nil {
			errs = append(errs, fmt.Errorf("%s: no %s %s", o, o.RoleRef.Kind, o.RoleRef.Name))
		}
		for _, sub := range o.Subjects {
			if sa := s.find(sub.Kind, sub.Name); sa == nil || sa.Metadata.Namespace != sub.Namespace {
				errs = append(errs, fmt.Errorf("%s: no %s %s/%s", o, sub.Kind, sub.Namespace, sub.Name))
			}
		}
	}
	return errs
}

// checkImage: every program a manifest runs is built into the image and
// copied where the runtime stage's PATH finds it, and the runtime stage
// installs the node plugin's tools.
func (s *set) checkImage() []error {
	var errs []error
	cf := strings.ReplaceAll(s.containerfile, "\\\n", " ") // one line per instruction
	stages := regexp.MustCompile(`(?m)^FROM\s`).Split(cf, -1)
	runtime := stages[len(stages)-1]
	build := regexp.MustCompile(`go build[^\n]*`).FindAllString(cf, -1)
	s.containers(func(o *object, _ *podSpec, c *container) {
		if strings.HasPrefix(o.file, "examples/") || !strings.HasPrefix(c.Image, "blk:") && c.Image != s.images["BLK_IMAGE"] {
			return
		}
		prog := c.program()
		if prog == "" {
			errs = append(errs, fmt.Errorf("%s: %s runs no program this test can name", o, c.Name))
			return
		}
		if !slices.ContainsFunc(build, func(b string) bool { return strings.Contains(b, "./cmd/"+prog) }) {
			errs = append(errs, fmt.Errorf("%s: %s runs %s, which the Containerfile does not build (./cmd/%s)", o, c.Name, prog, prog))
		}
		if !regexp.MustCompile(`(?m)^COPY --from=\S+ [^\n]*/` + regexp.QuoteMeta(prog) + `( |$)[^\n]*/usr/local/bin/`).MatchString(runtime) {
			errs = append(errs, fmt.Errorf("%s: %s runs %s, which the Containerfile's last stage does not copy to /usr/local/bin", o, c.Name, prog))
		}
	})
	for _, pkg := range []string{"e2fsprogs", "xfsprogs", "util-linux", "kmod"} {
		if !regexp.MustCompile(`apt-get install[^\n]*\s` + pkg + `(\s|$)`).MatchString(runtime) {
			errs = append(errs, fmt.Errorf("Containerfile: the runtime stage does not install %s", pkg))
		}
	}
	return errs
}

// checkFlags: the flags and variables the manifests give blk-csi and blkd
// are theirs.
func (s *set) checkFlags() []error {
	var errs []error
	flagName := regexp.MustCompile(`^--([a-z0-9-]+)`)
	s.containers(func(o *object, _ *podSpec, c *container) {
		switch c.program() {
		case "blk-csi":
			for _, a := range c.Args {
				m := flagName.FindStringSubmatch(a)
				if m == nil || !slices.Contains(blkCSIFlags, m[1]) {
					errs = append(errs, fmt.Errorf("%s: blk-csi argument %q is none of its flags %v", o, a, blkCSIFlags))
				}
			}
		case "blkd":
			sc := c.script()
			for _, m := range regexp.MustCompile(`(?:^|\s)--([a-z0-9-]+)`).FindAllStringSubmatch(sc, -1) {
				if !strings.Contains(s.blkdMain, `Name: "`+m[1]+`"`) {
					errs = append(errs, fmt.Errorf("%s: blkd --%s is not a flag in cmd/blkd/main.go", o, m[1]))
				}
			}
			for _, e := range c.Env {
				if strings.HasPrefix(e.Name, "BLK_") && e.Name != "BLK_SEED_NODE" && !strings.Contains(s.blkdMain, `"`+e.Name+`"`) {
					errs = append(errs, fmt.Errorf("%s: blkd reads no variable %s", o, e.Name))
				}
			}
		}
	})
	return errs
}

// checkAPIAddress: one API port everywhere: blkd listens on it, probes
// and the Service reach it, the CSI driver and joining nodes dial it.
func (s *set) checkAPIAddress() []error {
	var errs []error
	svc := s.find("Service", "blkd")
	ds := s.find("DaemonSet", "blkd")
	cm := s.find("ConfigMap", "blk-csi")
	if svc == nil || ds == nil || cm == nil {
		return []error{fmt.Errorf("no Service, DaemonSet blkd or ConfigMap blk-csi")}
	}
	addr := fmt.Sprintf("blkd.%s.svc:", svc.Metadata.Namespace)
	const port = 7070
	if want := fmt.Sprintf("https://%s%d", addr, port); cm.Data["api"] != want {
		errs = append(errs, fmt.Errorf("%s: api %q, want %q", cm, cm.Data["api"], want))
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != port || svc.Spec.Ports[0].TargetPort != port {
		errs = append(errs, fmt.Errorf("%s: ports %+v, want %d to %d", svc, svc.Spec.Ports, port, port))
	}
	c := &ds.pod().Containers[0]
	if !strings.Contains(c.script(), fmt.Sprintf(`--api-addr "$POD_IP:%d"`, port)) {
		errs = append(errs, fmt.Errorf("%s: blkd's --api-addr is not $POD_IP:%d", ds, port))
	}
	for _, e := range c.Env {
		if e.Name == "BLK_JOIN" && e.Value != fmt.Sprintf("%s%d", addr, port) {
			errs = append(errs, fmt.Errorf("%s: BLK_JOIN %q, want %s%d", ds, e.Value, addr, port))
		}
	}
	named := map[string]int{}
	for _, p := range c.Ports {
		named[p.Name] = p.ContainerPort
	}
	for what, pr := range map[string]*probe{"/livez": c.StartupProbe, "/livez ": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if pr == nil || pr.HTTPGet == nil {
			errs = append(errs, fmt.Errorf("%s: no probe of %s", ds, strings.TrimSpace(what)))
			continue
		}
		g := pr.HTTPGet
		p, _ := g.Port.(string)
		if g.Path != strings.TrimSpace(what) || g.Scheme != "HTTPS" || named[p] != port {
			errs = append(errs, fmt.Errorf("%s: probe %s %v on %v, want HTTPS %s on %d", ds, g.Scheme, g.Path, g.Port, strings.TrimSpace(what), port))
		}
	}
	if !ds.pod().HostNetwork || ds.pod().DNSPolicy != "ClusterFirstWithHostNet" {
		errs = append(errs, fmt.Errorf("%s: blkd must be on the host's network and resolve the Service's name", ds))
	}
	return errs
}

var checks = map[string]func(*set) []error{
	"images":      (*set).checkImages,
	"driver name": (*set).checkDriverName,
	"sockets":     (*set).checkSockets,
	"parameters":  (*set).checkParameters,
	"references":  (*set).checkReferences,
	"image":       (*set).checkImage,
	"flags":       (*set).checkFlags,
	"api address": (*set).checkAPIAddress,
}

// TestManifests runs every check on the files as they are.
func TestManifests(t *testing.T) {
	s := load(t)
	names := make([]string, 0, len(checks))
	for n := range checks {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			for _, err := range checks[n](s) {
				t.Error(err)
			}
		})
	}
}

// TestChecksCatch breaks the loaded files one way at a time: each check
// must say so.
func TestChecksCatch(t *testing.T) {
	controller := func(s *set) *podSpec { return s.find("Deployment", "blk-csi-controller").pod() }
	node := func(s *set) *podSpec { return s.find("DaemonSet", "blk-csi-node").pod() }
	named := func(p *podSpec, name string) *container {
		for i := range p.Containers {
			if p.Containers[i].Name == name {
				return &p.Containers[i]
			}
		}
		t.Fatalf("no container %s", name)
		return nil
	}
	setArg := func(c *container, name, val string) {
		for i, a := range c.Args {
			if strings.HasPrefix(a, "--"+name+"=") {
				c.Args[i] = "--" + name + "=" + val
				return
			}
		}
		t.Fatalf("%s has no --%s", c.Name, name)
	}
	cases := []struct {
		check string
		want  string
		brk   func(s *set)
	}{
		{"images", "does not pin", func(s *set) { named(controller(s), "csi-attacher").Image += "-rc1" }},
		{"images", "used by no manifest", func(s *set) { s.images["EXTRA"] = "registry.k8s.io/x:v1" }},
		{"images", "no pinned tag", func(s *set) { s.images["CSI_ATTACHER_IMAGE"] = "registry.k8s.io/sig-storage/csi-attacher" }},
		{"driver name", "names the driver", func(s *set) { s.find("StorageClass", "blk").Provisioner = "blk.example.com" }},
		{"sockets", "blk-csi listens on", func(s *set) { setArg(named(controller(s), "csi-resizer"), "csi-address", "/csi/other.sock") }},
		{"sockets", "kubelet-registration-path", func(s *set) {
			setArg(named(node(s), "node-driver-registrar"), "kubelet-registration-path", "/var/lib/kubelet/plugins/other/csi.sock")
		}},
		{"sockets", "is not unix:///PATH", func(s *set) { setArg(named(node(s), "blk-csi"), "endpoint", "tcp://0.0.0.0:10000") }},
		{"parameters", "is not the driver's", func(s *set) { s.find("StorageClass", "blk").Parameters["replica"] = "3" }},
		{"parameters", "is not one of", func(s *set) { s.find("StorageClass", "blk").Parameters["blockSize"] = "1024" }},
		{"parameters", "without csi.storage.k8s.io/node-stage-secret-name", func(s *set) {
			delete(s.find("StorageClass", "blk-dhchap").Parameters, "csi.storage.k8s.io/node-stage-secret-name")
		}},
		{"references", "has no operator.key", func(s *set) { delete(s.find("Secret", "blk-csi-node-tls").StringData, "operator.key") }},
		{"references", "reads key", func(s *set) { delete(s.find("ConfigMap", "blk-csi").Data, "api") }},
		{"references", "no ServiceAccount", func(s *set) { node(s).ServiceAccountName = "default-sa" }},
		{"image", "does not build", func(s *set) {
			s.containerfile = strings.Replace(s.containerfile, "./cmd/blk-csi", "./cmd/blkctl", 1)
		}},
		{"image", "does not install xfsprogs", func(s *set) {
			s.containerfile = strings.Replace(s.containerfile, " xfsprogs", "", 1)
		}},
		{"flags", "none of its flags", func(s *set) { c := named(node(s), "blk-csi"); c.Args = append(c.Args, "--nodename=x") }},
		{"flags", "not a flag in cmd/blkd/main.go", func(s *set) {
			c := &s.find("DaemonSet", "blkd").pod().Containers[0]
			c.Args[0] = strings.Replace(c.Args[0], "--data-dir", "--datadir", 1)
		}},
		{"api address", "want HTTPS /readyz", func(s *set) {
			s.find("DaemonSet", "blkd").pod().Containers[0].ReadinessProbe.HTTPGet.Path = "/healthz"
		}},
		{"api address", "api \"", func(s *set) { s.find("ConfigMap", "blk-csi").Data["api"] = "https://blkd:7070" }},
	}
	for _, tc := range cases {
		s := load(t)
		if errs := checks[tc.check](s); len(errs) != 0 {
			t.Fatalf("%s: fails before the change: %v", tc.check, errs)
		}
		tc.brk(s)
		errs := checks[tc.check](s)
		if !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), tc.want) }) {
			t.Errorf("%s: after the change, want an error with %q, got %v", tc.check, tc.want, errs)
		}
	}
}
