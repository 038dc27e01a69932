package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"gopkg.in/yaml.v3"

	"github.com/pgquic/pgquic/config"
	"github.com/pgquic/pgquic/internal/pgtest"
	"github.com/pgquic/pgquic/quicclient"
)

// defaultPort returns the port of a default listen address.
func defaultPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// yamlDocs decodes every document of a YAML file into generic maps.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d != nil {
			docs = append(docs, d)
		}
	}
	return docs
}

// dig walks maps and lists by keys ("0" indexes a list) and returns the
// value, failing the test when a step is missing.
func dig(t *testing.T, v any, path ...string) any {
	t.Helper()
	for i, k := range path {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[k]; !ok {
				t.Fatalf("missing %s", strings.Join(path[:i+1], "."))
			}
		case []any:
			n, err := strconv.Atoi(k)
			if err != nil || n >= len(c) {
				t.Fatalf("missing %s", strings.Join(path[:i+1], "."))
			}
			v = c[n]
		default:
			t.Fatalf("%s is not a map or list", strings.Join(path[:i], "."))
		}
	}
	return v
}

// flagsIn returns the --flags of a serve command line.
func flagsIn(args []string) []string {
	var out []string
	for _, a := range args {
		if strings.HasPrefix(a, "--") {
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			out = append(out, name)
		}
	}
	return out
}

// checkServeArgs checks a command line given to the binary: serve, and
// only flags serve has.
func checkServeArgs(t *testing.T, where string, flags map[string]bool, args []string) {
	t.Helper()
	if len(args) == 0 || args[0] != "serve" {
		t.Errorf("%s: command %q does not start with serve", where, args)
		return
	}
	for _, f := range flagsIn(args) {
		if !flags[f] {
			t.Errorf("%s: flag --%s is not a flag of pgquic serve", where, f)
		}
	}
}

// stringList converts a YAML list of strings.
func stringList(t *testing.T, v any) []string {
	t.Helper()
	l, ok := v.([]any)
	if !ok {
		t.Fatalf("not a list: %v", v)
	}
	var out []string
	for _, e := range l {
		out = append(out, fmt.Sprint(e))
	}
	return out
}

// dockerfile is what the test reads from the container build file.
type dockerfile struct {
	froms      []string
	user       string
	entrypoint []string
	cmd        []string
	expose     []string
	runs       []string
	copies     []string
}

func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var d dockerfile
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		rest = strings.TrimSpace(rest)
		execForm := func() []string {
			var v []string
			if err := json.Unmarshal([]byte(rest), &v); err != nil {
				t.Fatalf("%s: %s is not in exec (JSON) form: %v", path, instr, err)
			}
			return v
		}
		switch strings.ToUpper(instr) {
		case "FROM":
			d.froms = append(d.froms, strings.Fields(rest)[0])
		case "USER":
			d.user = rest
		case "ENTRYPOINT":
			d.entrypoint = execForm()
		case "CMD":
			d.cmd = execForm()
		case "EXPOSE":
			d.expose = append(d.expose, strings.Fields(rest)...)
		case "RUN":
			d.runs = append(d.runs, rest)
		case "COPY":
			d.copies = append(d.copies, rest)
		}
	}
	return d
}

// TestDockerfile: a static build, a distroless or scratch final stage, a
// non-root user, the binary as ENTRYPOINT, serve as CMD with real flags and
// the binary's default ports exposed.
func TestDockerfile(t *testing.T) {
	d := parseDockerfile(t, "Dockerfile")
	final := d.froms[len(d.froms)-1]
	if !strings.HasPrefix(final, "gcr.io/distroless/static") && final != "scratch" {
		t.Errorf("final stage %q is neither distroless static nor scratch", final)
	}
	uid, _, _ := strings.Cut(d.user, ":")
	if uid == "" || uid == "root" || uid == "0" {
		t.Errorf("USER %q is root or unset", d.user)
	}
	if !slices.ContainsFunc(d.runs, func(r string) bool {
		return strings.Contains(r, "CGO_ENABLED=0") && strings.Contains(r, "go build") && strings.Contains(r, "./cmd/pgquic")
	}) {
		t.Errorf("no RUN builds ./cmd/pgquic with CGO_ENABLED=0: %q", d.runs)
	}
	if len(d.entrypoint) != 1 {
		t.Fatalf("ENTRYPOINT %q: want the binary alone", d.entrypoint)
	}
	if !slices.ContainsFunc(d.copies, func(c string) bool {
		return strings.HasPrefix(c, "--from=") && strings.HasSuffix(c, " "+d.entrypoint[0])
	}) {
		t.Errorf("ENTRYPOINT %s is not the binary copied from the build stage (%q)", d.entrypoint[0], d.copies)
	}
	checkServeArgs(t, "Dockerfile CMD", serveFlags(t), d.cmd)
	want := []string{
		fmt.Sprintf("%d/tcp", defaultPort(t, config.DefaultTCPListen)),
		fmt.Sprintf("%d/udp", defaultPort(t, config.DefaultQUICListen)),
		fmt.Sprintf("%d/tcp", defaultPort(t, config.DefaultMetricsListen)),
	}
	slices.Sort(want)
	got := slices.Clone(d.expose)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("EXPOSE %q, want the binary's defaults %q", got, want)
	}
}

// TestSystemdUnit: ExecStart runs serve with real flags, the stop timeout
// outlasts the default drain, and, where systemd-analyze exists, the unit
// verifies and its exposure score is at most 2.0 ("OK").
func TestSystemdUnit(t *testing.T) {
	const unit = "systemd/pgquic.service"
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	var execStart []string
	var stopSec time.Duration
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, "=")
		switch {
		case !ok:
		case k == "ExecStart":
			execStart = strings.Fields(v)
		case k == "TimeoutStopSec":
			if stopSec, err = time.ParseDuration(v); err != nil {
				t.Fatalf("TimeoutStopSec=%s: %v", v, err)
			}
		}
	}
	if len(execStart) < 2 || execStart[0] != "/usr/local/bin/pgquic" {
		t.Fatalf("ExecStart=%q", execStart)
	}
	checkServeArgs(t, unit+" ExecStart", serveFlags(t), execStart[1:])
	if stopSec <= config.DefaultShutdownGrace {
		t.Errorf("TimeoutStopSec %v does not outlast the default shutdown_grace %v", stopSec, config.DefaultShutdownGrace)
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze not installed (.ci/run installs systemd)")
		}
		t.Skip("systemd-analyze not installed: unit not linted")
	}
	// verify checks that ExecStart exists: point it at the built binary.
	tmp := filepath.Join(t.TempDir(), "pgquic.service")
	if err := os.WriteFile(tmp, bytes.ReplaceAll(b, []byte("/usr/local/bin/pgquic"), []byte(pgquicBinary(t))), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(analyze, "verify", tmp).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err := exec.Command(analyze, "security", "--offline=true", tmp).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	if score, _ := strconv.ParseFloat(string(m[1]), 64); score > 2.0 {
		t.Errorf("systemd-analyze security exposure %v, want at most 2.0", score)
	}
}

// TestConfigFiles: the pgquic configuration files shipped in deploy/ load
// with the strict parser and listen on the default ports.
func TestConfigFiles(t *testing.T) {
	if _, err := config.Load("compose/pgquic.yml"); err != nil {
		t.Errorf("compose/pgquic.yml: %v", err)
	}
	cm := yamlDocs(t, "kubernetes/configmap.yaml")[0]
	cfg, err := config.Parse([]byte(fmt.Sprint(dig(t, cm, "data", "pgquic.yml"))))
	if err != nil {
		t.Fatalf("ConfigMap pgquic.yml: %v", err)
	}
	for _, a := range []string{cfg.TCPListen, cfg.QUICListen, cfg.MetricsListen} {
		if a == "" {
			t.Error("the ConfigMap disables a listener")
		}
	}
}

// manifests returns the Kubernetes objects by kind.
func manifests(t *testing.T) map[string][]map[string]any {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[string][]map[string]any{}
	for _, f := range files {
		for _, d := range yamlDocs(t, f) {
			kind, _ := d["kind"].(string)
			byKind[kind] = append(byKind[kind], d)
		}
	}
	return byKind
}

// TestKubernetesManifests checks what the issue asks of the manifests and
// that they agree with the binary and with each other.
func TestKubernetesManifests(t *testing.T) {
	k := manifests(t)
	for _, kind := range []string{"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget", "HorizontalPodAutoscaler", "Kustomization"} {
		if len(k[kind]) == 0 {
			t.Fatalf("no %s", kind)
		}
	}
	dep := k["Deployment"][0]
	name := dig(t, dep, "metadata", "name")
	if r, _ := dig(t, dep, "spec", "replicas").(int); r < 2 {
		t.Errorf("replicas %v, want several", r)
	}
	pod := dig(t, dep, "spec", "template", "spec")
	c := dig(t, pod, "containers", "0")
	checkServeArgs(t, "Deployment args", serveFlags(t), stringList(t, dig(t, c, "args")))

	// Ports: TCP and UDP on the binary's default pooler port, metrics on its default.
	type port struct {
		name, proto string
		num         int
	}
	var ports []port
	for _, p := range dig(t, c, "ports").([]any) {
		ports = append(ports, port{fmt.Sprint(dig(t, p, "name")), fmt.Sprint(dig(t, p, "protocol")), dig(t, p, "containerPort").(int)})
	}
	pgPort, metricsPort := defaultPort(t, config.DefaultTCPListen), defaultPort(t, config.DefaultMetricsListen)
	portByName := map[string]port{}
	for _, p := range ports {
		portByName[p.name] = p
	}
	for _, want := range []port{{"", "TCP", pgPort}, {"", "UDP", pgPort}, {"", "TCP", metricsPort}} {
		if !slices.ContainsFunc(ports, func(p port) bool { return p.proto == want.proto && p.num == want.num }) {
			t.Errorf("container lacks port %d/%s", want.num, want.proto)
		}
	}

	// The ConfigMap's listen addresses use those ports.
	cfg, err := config.Parse([]byte(fmt.Sprint(dig(t, k["ConfigMap"][0], "data", "pgquic.yml"))))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct {
		addr string
		port int
	}{{cfg.TCPListen, pgPort}, {cfg.QUICListen, pgPort}, {cfg.MetricsListen, metricsPort}} {
		if host, p, _ := net.SplitHostPort(a.addr); p != strconv.Itoa(a.port) || (host != "0.0.0.0" && host != "" && host != "::") {
			t.Errorf("ConfigMap listens on %s: want every address on port %d", a.addr, a.port)
		}
	}

	// Probes on the health endpoints of the metrics port.
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if got := dig(t, c, probe, "httpGet", "path"); got != path {
			t.Errorf("%s path %v, want %s", probe, got, path)
		}
		p := dig(t, c, probe, "httpGet", "port")
		if named, ok := p.(string); ok {
			p = portByName[named].num
		}
		if p != metricsPort {
			t.Errorf("%s on port %v, want the metrics port %d", probe, p, metricsPort)
		}
	}

	// preStop pause plus the drain fit in the termination grace period.
	preStop := time.Duration(dig(t, c, "lifecycle", "preStop", "sleep", "seconds").(int)) * time.Second
	grace := time.Duration(dig(t, pod, "terminationGracePeriodSeconds").(int)) * time.Second
	if need := preStop + cfg.ShutdownGrace + 5*time.Second; grace < need {
		t.Errorf("terminationGracePeriodSeconds %v < preStop %v + shutdown_grace %v + 5s", grace, preStop, cfg.ShutdownGrace)
	}

	// Non-root, read-only root file system.
	if dig(t, pod, "securityContext", "runAsNonRoot") != true || dig(t, c, "securityContext", "readOnlyRootFilesystem") != true {
		t.Error("the pod must run as non-root with a read-only root file system")
	}

	// Every file the configuration names is in a mounted ConfigMap or Secret key.
	mounts := map[string]string{} // mount path -> volume name
	for _, m := range dig(t, c, "volumeMounts").([]any) {
		mounts[fmt.Sprint(dig(t, m, "mountPath"))] = fmt.Sprint(dig(t, m, "name"))
	}
	volumes := map[string]map[string]any{}
	for _, v := range dig(t, pod, "volumes").([]any) {
		volumes[fmt.Sprint(dig(t, v, "name"))] = v.(map[string]any)
	}
	keysOf := func(kind, objName string) map[string]any {
		for _, o := range k[kind] {
			if dig(t, o, "metadata", "name") == objName {
				if kind == "ConfigMap" {
					return dig(t, o, "data").(map[string]any)
				}
				return dig(t, o, "stringData").(map[string]any)
			}
		}
		t.Fatalf("no %s %s", kind, objName)
		return nil
	}
	fileProvided := func(path string) bool {
		dir, file := filepath.Split(path)
		vol, ok := volumes[mounts[filepath.Clean(dir)]]
		if !ok {
			return false
		}
		var keys map[string]any
		if cm, ok := vol["configMap"]; ok {
			keys = keysOf("ConfigMap", fmt.Sprint(dig(t, cm, "name")))
		} else if s, ok := vol["secret"]; ok {
			keys = keysOf("Secret", fmt.Sprint(dig(t, s, "secretName")))
		}
		_, ok = keys[file]
		return ok
	}
	args := stringList(t, dig(t, c, "args"))
	if i := slices.Index(args, "--config"); i < 0 || !fileProvided(args[i+1]) {
		t.Errorf("--config file is not a mounted ConfigMap key: %q", args)
	}
	for key, path := range map[string]string{"tls_cert": cfg.TLSCert, "tls_key": cfg.TLSKey, "auth.file": cfg.Auth.File,
		"tls_session_ticket_keys_file": cfg.TLSSessionTicketKeysFile, "quic_stateless_reset_key_file": cfg.QUICStatelessResetKeyFile} {
		if path == "" || !fileProvided(path) {
			t.Errorf("%s %q is not a key of a mounted Secret", key, path)
		}
	}

	// One Service with the pooler port over TCP and UDP, selecting the pods.
	svc := k["Service"][0]
	labels := dig(t, dep, "spec", "template", "metadata", "labels").(map[string]any)
	for key, v := range dig(t, svc, "spec", "selector").(map[string]any) {
		if labels[key] != v {
			t.Errorf("Service selector %s=%v does not match the pods", key, v)
		}
	}
	protos := map[string]bool{}
	for _, p := range dig(t, svc, "spec", "ports").([]any) {
		target := dig(t, p, "targetPort")
		if named, ok := target.(string); ok {
			tp, ok := portByName[named]
			if !ok {
				t.Errorf("Service targetPort %q is not a container port", named)
			}
			if tp.proto != dig(t, p, "protocol") {
				t.Errorf("Service port %v/%v targets %s/%s", dig(t, p, "port"), dig(t, p, "protocol"), named, tp.proto)
			}
			target = tp.num
		}
		if dig(t, p, "port") == pgPort && target == pgPort {
			protos[fmt.Sprint(dig(t, p, "protocol"))] = true
		}
	}
	if !protos["TCP"] || !protos["UDP"] {
		t.Errorf("Service exposes port %d over %v, want TCP and UDP", pgPort, protos)
	}

	// The PodDisruptionBudget and the autoscaler point at the Deployment.
	for key, v := range dig(t, k["PodDisruptionBudget"][0], "spec", "selector", "matchLabels").(map[string]any) {
		if labels[key] != v {
			t.Errorf("PodDisruptionBudget selector %s=%v does not match the pods", key, v)
		}
	}
	hpa := k["HorizontalPodAutoscaler"][0]
	if dig(t, hpa, "spec", "scaleTargetRef", "kind") != "Deployment" || dig(t, hpa, "spec", "scaleTargetRef", "name") != name {
		t.Error("the HorizontalPodAutoscaler does not scale the Deployment")
	}
	if minR, _ := dig(t, hpa, "spec", "minReplicas").(int); minR < 2 {
		t.Errorf("HPA minReplicas %d, want several", minR)
	}

	// The kustomization lists every manifest file.
	files, _ := filepath.Glob("kubernetes/*.yaml")
	res := stringList(t, dig(t, k["Kustomization"][0], "resources"))
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !slices.Contains(res, b) {
			t.Errorf("kustomization.yaml does not list %s", b)
		}
	}
}

// TestComposeFile: PostgreSQL plus pgquic built from the Dockerfile, the
// default ports over TCP and UDP, a serve command with real flags, and
// files that exist.
func TestComposeFile(t *testing.T) {
	const path = "compose/compose.yaml"
	c := yamlDocs(t, path)[0]
	svcs := dig(t, c, "services").(map[string]any)
	if img := fmt.Sprint(dig(t, svcs, "postgres", "image")); !strings.HasPrefix(img, "postgres:") {
		t.Errorf("postgres image %q", img)
	}
	pq := svcs["pgquic"]
	ctxDir := filepath.Join("compose", fmt.Sprint(dig(t, pq, "build", "context")))
	if _, err := os.Stat(filepath.Join(ctxDir, fmt.Sprint(dig(t, pq, "build", "dockerfile")))); err != nil {
		t.Errorf("build file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ctxDir, "go.mod")); err != nil {
		t.Errorf("build context is not the module root: %v", err)
	}
	checkServeArgs(t, path, serveFlags(t), stringList(t, dig(t, pq, "command")))
	pgPort, metricsPort := defaultPort(t, config.DefaultTCPListen), defaultPort(t, config.DefaultMetricsListen)
	ports := stringList(t, dig(t, pq, "ports"))
	for _, want := range []string{fmt.Sprintf("%d:%d/tcp", pgPort, pgPort), fmt.Sprintf("%d:%d/udp", pgPort, pgPort), fmt.Sprintf("%d:%d/tcp", metricsPort, metricsPort)} {
		if !slices.Contains(ports, want) {
			t.Errorf("pgquic ports %q lack %s", ports, want)
		}
	}
	for _, section := range []string{"configs", "secrets"} {
		for name, v := range dig(t, c, section).(map[string]any) {
			if _, err := os.Stat(filepath.Join("compose", fmt.Sprint(dig(t, v, "file")))); err != nil {
				t.Errorf("%s %s: %v", section, name, err)
			}
		}
	}
	if dep := fmt.Sprint(dig(t, pq, "depends_on", "postgres", "condition")); dep != "service_healthy" {
		t.Errorf("pgquic starts before PostgreSQL is healthy: %s", dep)
	}
}

// metricRef matches series names in PromQL expressions.
var metricRef = regexp.MustCompile(`\b((?:pgquic|go|process)_[a-z_]+)\b`)

// usedMetrics returns the series names the dashboard and the scrape
// configuration use, with histogram suffixes removed.
func usedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	b, err := os.ReadFile("grafana/pgquic-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatal("dashboard lacks a title, uid or panels")
	}
	add := func(where, expr string) {
		for _, m := range metricRef.FindAllString(expr, -1) {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				m = strings.TrimSuffix(m, suf)
			}
			used[m] = append(used[m], where)
		}
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
			add("dashboard panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		add("dashboard variable", fmt.Sprint(v.Query))
	}

	prom := yamlDocs(t, "prometheus/prometheus.yml")[0]
	for _, sc := range dig(t, prom, "scrape_configs").([]any) {
		if dig(t, sc, "job_name") == "pgquic" {
			target := fmt.Sprint(dig(t, sc, "static_configs", "0", "targets", "0"))
			if _, p, _ := net.SplitHostPort(target); p != strconv.Itoa(defaultPort(t, config.DefaultMetricsListen)) {
				t.Errorf("prometheus target %s is not on the metrics port", target)
			}
		}
	}
	dep := manifests(t)["Deployment"][0]
	ann := dig(t, dep, "spec", "template", "metadata", "annotations").(map[string]any)
	if ann["prometheus.io/port"] != strconv.Itoa(defaultPort(t, config.DefaultMetricsListen)) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v do not match the metrics server", ann)
	}
	return used
}

// exposedMetrics runs the built binary against PostgreSQL, drives sessions
// over TCP and QUIC plus an error and a refused stream, and returns the
// metric families /metrics then shows.
func exposedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	cluster := pgtest.New(t, pgtest.Options{})
	s := startServe(t, "--backend", cluster.SuperURL("postgres"), "--tcp-listen", "127.0.0.1:0", "--quic-listen", "127.0.0.1:0",
		"--metrics-listen", "127.0.0.1:0", "--pool-size", "2", "--min-pool", "1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tcpURL := fmt.Sprintf("postgres://%s:%s@%s/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, s.tcp)
	c, err := pgconn.Connect(ctx, tcpURL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	// An error the pooler raises itself: a database name too long for a pool.
	if c, err := pgconn.Connect(ctx, fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", cluster.SuperUser, cluster.SuperPassword, s.tcp, "no_such_db")); err == nil {
		c.Close(ctx)
	}
	d, err := quicclient.NewDialer(quicclient.DialerConfig{Addr: s.quic, Insecure: true, Conns: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pc, err := pgconn.ParseConfig(fmt.Sprintf("postgres://%s:%s@quic/postgres?sslmode=disable", cluster.SuperUser, cluster.SuperPassword))
	if err != nil {
		t.Fatal(err)
	}
	pc.DialFunc, pc.LookupFunc = d.DialFunc(), d.LookupFunc()
	qc, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qc.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
		t.Fatal(err)
	}
	qc.Close(ctx)
	// A stream that ends before its startup packet: refused with reason eof.
	if raw, err := d.Dial(ctx); err == nil {
		raw.Close()
	}
	_, body, err := httpGet("http://" + s.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) `).FindAllStringSubmatch(body, -1) {
		names[m[1]] = true
	}
	return names
}

// sourceMetrics is the fallback for vectors that had no series in the
// scrape: full names written in the source, or a Name next to a
// Subsystem constant in the same file, outside tests.
func sourceMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	nameRe := regexp.MustCompile(`Name:\s*"([a-z_]+)"`)
	subRe := regexp.MustCompile(`(?:Subsystem:\s*|sub\s*=\s*|, )"([a-z]+)"`)
	err := filepath.WalkDir("..", func(path string, de os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if de.IsDir() && (de.Name() == "testdata" || strings.HasPrefix(de.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var subs []string
		for _, m := range subRe.FindAllSubmatch(b, -1) {
			subs = append(subs, string(m[1]))
		}
		for _, m := range nameRe.FindAllSubmatch(b, -1) {
			n := string(m[1])
			if strings.HasPrefix(n, "pgquic_") {
				names[n] = true
			}
			for _, s := range subs {
				names["pgquic_"+s+"_"+n] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestMetricNamesExist: every series the dashboard and scrape setup use is
// one the binary exposes (seen in a real scrape, or for a vector without
// series yet, defined in the source).
func TestMetricNamesExist(t *testing.T) {
	used := usedMetrics(t)
	exposed := exposedMetrics(t)
	var fromSource []string
	src := sourceMetrics(t)
	for name, where := range used {
		switch {
		case exposed[name]:
		case src[name]:
			fromSource = append(fromSource, name)
		default:
			t.Errorf("%s (used by %s) is not a metric of pgquic serve", name, strings.Join(slices.Compact(where), ", "))
		}
	}
	slices.Sort(fromSource)
	t.Logf("%d series names used; not in the scrape (vectors without series yet), found in the source: %v", len(used), fromSource)
	if len(fromSource) > len(used)/3 {
		t.Errorf("too few names checked against a real scrape: %v", fromSource)
	}
}
