// Package k8s checks the Kubernetes manifests in deploy/k8s/ without a cluster: every document
// decodes strictly (an unknown or misspelt field is an error) into the API type of its kind,
// and the names the documents use to refer to each other agree (selectors and labels, named
// ports, volumes, Secret and ConfigMap keys, and the Dapr pluggable component: the sidecar's
// socket, the socket folder the injector mounts, and the Component's type).
//
// The repository is named by STATEGATE_REPO (the integration test `deploy::k8s_manifests`
// passes it); `scripts/go-peers` compiles this module into k8s.test.
package k8s

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Component mirrors dapr's components API type (github.com/dapr/dapr
// pkg/apis/components/v1alpha1 Component, 1.18): dapr's module cannot be required as a library
// here (its go.mod carries replace directives), so its fields are copied, for strict decoding.
type Component struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ComponentSpec `json:"spec,omitempty"`
	Auth              struct {
		SecretStore string `json:"secretStore"`
	} `json:"auth,omitempty"`
	Scopes []string `json:"scopes,omitempty"`
}

type ComponentSpec struct {
	Type         string          `json:"type"`
	Version      string          `json:"version"`
	IgnoreErrors bool            `json:"ignoreErrors"`
	Metadata     []NameValuePair `json:"metadata"`
	InitTimeout  string          `json:"initTimeout"`
}

type NameValuePair struct {
	Name         string          `json:"name"`
	Value        json.RawMessage `json:"value,omitempty"`
	SecretKeyRef struct {
		Name string `json:"name"`
		Key  string `json:"key"`
	} `json:"secretKeyRef,omitempty"`
	EnvRef string `json:"envRef,omitempty"`
}

// Where Dapr's injector mounts the component socket volume when the pod does not say
// (dapr pkg/injector/consts ComponentsUDSDefaultFolder), and that volume's name.
const (
	defaultSocketsFolder = "/tmp/dapr-components-sockets"
	injectedSocketVolume = "dapr-components-unix-domain-socket"
)

// A workload: the pod template of a Deployment or StatefulSet.
type workload struct {
	where    string
	selector *metav1.LabelSelector
	pod      corev1.PodTemplateSpec
	claims   []string
}

type manifests struct {
	workloads  []workload
	services   map[string]corev1.Service
	configMaps map[string]corev1.ConfigMap
	secrets    map[string]corev1.Secret
	components []Component
}

func repo(t *testing.T) string {
	dir := os.Getenv("STATEGATE_REPO")
	if dir == "" {
		t.Fatal("STATEGATE_REPO is not set: run this through the integration tests (deploy::k8s_manifests) or set it to the repository's root")
	}
	return dir
}

// documents splits a YAML stream on its `---` lines, dropping documents with only comments.
func documents(text []byte) [][]byte {
	var out [][]byte
	for _, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(text), -1) {
		for _, line := range strings.Split(doc, "\n") {
			trimmed := strings.TrimSpace(line)
			if trimmed != "" && !strings.HasPrefix(trimmed, "#") {
				out = append(out, []byte(doc))
				break
			}
		}
	}
	return out
}

func strict(t *testing.T, where string, doc []byte, into any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
}

func load(t *testing.T) manifests {
	m := manifests{
		services:   map[string]corev1.Service{},
		configMaps: map[string]corev1.ConfigMap{},
		secrets:    map[string]corev1.Secret{},
	}
	files, err := filepath.Glob(filepath.Join(repo(t), "deploy", "k8s", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no deploy/k8s/*.yaml under %s (%v)", repo(t), err)
	}
	sort.Strings(files)
	for _, file := range files {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range documents(text) {
			where := filepath.Base(file) + " document " + string(rune('1'+i))
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			where += " (" + meta.Kind + ")"
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 Deployment":
				var d appsv1.Deployment
				strict(t, where, doc, &d)
				m.workloads = append(m.workloads, workload{where: where, selector: d.Spec.Selector, pod: d.Spec.Template})
			case "apps/v1 StatefulSet":
				var s appsv1.StatefulSet
				strict(t, where, doc, &s)
				w := workload{where: where, selector: s.Spec.Selector, pod: s.Spec.Template}
				for _, c := range s.Spec.VolumeClaimTemplates {
					w.claims = append(w.claims, c.Name)
				}
				m.workloads = append(m.workloads, w)
			case "v1 Service":
				var s corev1.Service
				strict(t, where, doc, &s)
				m.services[s.Name] = s
			case "v1 ConfigMap":
				var c corev1.ConfigMap
				strict(t, where, doc, &c)
				m.configMaps[c.Name] = c
			case "v1 Secret":
				var s corev1.Secret
				strict(t, where, doc, &s)
				m.secrets[s.Name] = s
			case "dapr.io/v1alpha1 Component":
				var c Component
				strict(t, where, doc, &c)
				m.components = append(m.components, c)
			default:
				t.Fatalf("%s: a kind this test does not know (%s %s): add it", where, meta.APIVersion, meta.Kind)
			}
		}
	}
	return m
}

func matches(selector map[string]string, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

func TestEveryManifestDecodesStrictly(t *testing.T) {
	m := load(t)
	if len(m.workloads) < 3 || len(m.services) < 2 || len(m.components) < 1 {
		t.Fatalf("found %d workloads, %d services, %d components: is the scan broken?", len(m.workloads), len(m.services), len(m.components))
	}
}

func TestWorkloadsReferToWhatExists(t *testing.T) {
	m := load(t)
	for _, w := range m.workloads {
		if w.selector == nil || !matches(w.selector.MatchLabels, w.pod.Labels) {
			t.Errorf("%s: the selector %v does not match the pod labels %v", w.where, w.selector, w.pod.Labels)
		}
		volumes := map[string]bool{}
		for _, v := range w.pod.Spec.Volumes {
			volumes[v.Name] = true
			if v.ConfigMap != nil {
				if _, ok := m.configMaps[v.ConfigMap.Name]; !ok {
					t.Errorf("%s: volume %s names ConfigMap %s, which no manifest defines", w.where, v.Name, v.ConfigMap.Name)
				}
			}
		}
		for _, c := range w.claims {
			volumes[c] = true
		}
		for _, c := range append(append([]corev1.Container{}, w.pod.Spec.InitContainers...), w.pod.Spec.Containers...) {
			ports := map[string]bool{}
			for _, p := range c.Ports {
				if p.Name == "" {
					continue
				}
				if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
					t.Errorf("%s: container %s: port name %q: %v", w.where, c.Name, p.Name, errs)
				}
				if ports[p.Name] {
					t.Errorf("%s: container %s: port name %s twice", w.where, c.Name, p.Name)
				}
				ports[p.Name] = true
			}
			for _, probe := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
				if probe != nil && probe.HTTPGet != nil && probe.HTTPGet.Port.StrVal != "" && !ports[probe.HTTPGet.Port.StrVal] {
					t.Errorf("%s: container %s: a probe names port %s, which it does not declare", w.where, c.Name, probe.HTTPGet.Port.StrVal)
				}
			}
			for _, vm := range c.VolumeMounts {
				if !volumes[vm.Name] {
					t.Errorf("%s: container %s mounts volume %s, which the pod does not declare", w.where, c.Name, vm.Name)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					continue
				}
				ref := e.ValueFrom.SecretKeyRef
				s, ok := m.secrets[ref.Name]
				_, inString := s.StringData[ref.Key]
				_, inData := s.Data[ref.Key]
				if !ok || !(inString || inData) {
					t.Errorf("%s: container %s: %s names key %s of Secret %s, which no manifest defines", w.where, c.Name, e.Name, ref.Key, ref.Name)
				}
			}
		}
	}
}

func TestServicesSelectPodsAndTheirPorts(t *testing.T) {
	m := load(t)
	for name, s := range m.services {
		var selected []workload
		for _, w := range m.workloads {
			if matches(s.Spec.Selector, w.pod.Labels) {
				selected = append(selected, w)
			}
		}
		if len(selected) == 0 {
			t.Errorf("Service %s selects %v: no pod template has those labels", name, s.Spec.Selector)
			continue
		}
		for _, p := range s.Spec.Ports {
			if p.TargetPort.StrVal == "" {
				continue
			}
			for _, w := range selected {
				found := false
				for _, c := range w.pod.Spec.Containers {
					for _, cp := range c.Ports {
						found = found || cp.Name == p.TargetPort.StrVal
					}
				}
				if !found {
					t.Errorf("Service %s: target port %s is not a named port of %s", name, p.TargetPort.StrVal, w.where)
				}
			}
		}
	}
}

// flagValue is the value of `--name value` or `--name=value` in args.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

func envFrom(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// The app pods: each names its stategate sidecar as a pluggable component; the sidecar's
// socket is in the folder Dapr's injector mounts, and its file name is the Component's type.
func TestDaprAppPodsReachTheirSidecarAndTheSharedStore(t *testing.T) {
	m := load(t)
	apps := 0
	var centralStorage *corev1.SecretKeySelector
	for _, w := range m.workloads {
		for _, c := range w.pod.Spec.Containers {
			if e := envFrom(c, "STATEGATE_STORAGE"); e != nil && e.ValueFrom != nil && w.pod.Annotations["dapr.io/enabled"] != "true" {
				centralStorage = e.ValueFrom.SecretKeyRef
			}
		}
	}
	for _, w := range m.workloads {
		a := w.pod.Annotations
		if a["dapr.io/enabled"] != "true" {
			continue
		}
		apps++
		appID := a["dapr.io/app-id"]
		if appID == "" {
			t.Errorf("%s: dapr.io/enabled without dapr.io/app-id", w.where)
		}
		if a["dapr.io/enable-native-sidecar"] == "true" {
			t.Errorf("%s: a native daprd sidecar starts before every app container, before stategate's socket exists", w.where)
		}
		folder := a["dapr.io/pluggable-components-sockets-folder"]
		if folder == "" {
			folder = defaultSocketsFolder
		}
		for _, v := range w.pod.Spec.Volumes {
			if v.Name == injectedSocketVolume {
				t.Errorf("%s: declares volume %s, which Dapr's injector adds itself (a duplicate name is refused)", w.where, v.Name)
			}
		}
		names := strings.Split(a["dapr.io/pluggable-components"], ",")
		if a["dapr.io/pluggable-components"] == "" {
			t.Errorf("%s: a Dapr app without dapr.io/pluggable-components: daprd would not share the socket volume with stategate", w.where)
		}
		for i, name := range names {
			var sidecar *corev1.Container
			for j := range w.pod.Spec.Containers {
				if w.pod.Spec.Containers[j].Name == name {
					sidecar = &w.pod.Spec.Containers[j]
				}
			}
			if sidecar == nil {
				t.Errorf("%s: dapr.io/pluggable-components names %s, which is not a container of the pod", w.where, name)
				continue
			}
			if i == 0 && w.pod.Spec.Containers[0].Name != name {
				t.Errorf("%s: %s is not the first container: daprd (appended after the app's containers) must start after its socket exists", w.where, name)
			}
			socket := flagValue(sidecar.Args, "--dapr-component-socket")
			if socket == "" {
				t.Errorf("%s: container %s has no --dapr-component-socket", w.where, name)
				continue
			}
			if filepath.Dir(socket) != folder {
				t.Errorf("%s: the socket %s is not in the folder the injector mounts (%s)", w.where, socket, folder)
			}
			for _, vm := range sidecar.VolumeMounts {
				if vm.MountPath == folder {
					t.Errorf("%s: container %s mounts %s at the socket folder: the injector would then not mount daprd's volume there", w.where, name, vm.Name)
				}
			}
			if h := sidecar.Lifecycle; h == nil || h.PostStart == nil || h.PostStart.Exec == nil ||
				!strings.Contains(strings.Join(h.PostStart.Exec.Command, " "), socket) {
				t.Errorf("%s: container %s has no postStart hook waiting for %s (daprd looks for sockets once, at its start)", w.where, name, socket)
			}
			kind := "state." + strings.TrimSuffix(filepath.Base(socket), filepath.Ext(socket))
			found := false
			for _, comp := range m.components {
				scoped := len(comp.Scopes) == 0
				for _, s := range comp.Scopes {
					scoped = scoped || s == appID
				}
				found = found || (comp.Spec.Type == kind && scoped)
			}
			if !found {
				t.Errorf("%s: no Component of type %s for app %s (the socket %s)", w.where, kind, appID, socket)
			}
			storage := envFrom(*sidecar, "STATEGATE_STORAGE")
			if storage == nil || storage.ValueFrom == nil || storage.ValueFrom.SecretKeyRef == nil {
				t.Errorf("%s: container %s takes no STATEGATE_STORAGE from a Secret", w.where, name)
			} else if centralStorage == nil || *storage.ValueFrom.SecretKeyRef != *centralStorage {
				t.Errorf("%s: container %s's store (%v) is not the central replicas' (%v)", w.where, name, storage.ValueFrom.SecretKeyRef, centralStorage)
			}
			if e := envFrom(*sidecar, "STATEGATE_NODE_ID"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("%s: container %s: STATEGATE_NODE_ID must be the pod's name (distinct per replica)", w.where, name)
			}
		}
	}
	if apps == 0 {
		t.Fatal("no Dapr app (dapr.io/enabled: \"true\") among the workloads")
	}
	for _, comp := range m.components {
		if comp.APIVersion != "dapr.io/v1alpha1" || comp.Spec.Type == "" || comp.Spec.Version == "" {
			t.Errorf("Component %s: apiVersion, spec.type and spec.version are needed", comp.Name)
		}
		for _, md := range comp.Spec.Metadata {
			if len(bytes.TrimSpace(md.Value)) == 0 && md.SecretKeyRef.Name == "" {
				t.Errorf("Component %s: metadata %s has no value", comp.Name, md.Name)
			}
		}
	}
}
