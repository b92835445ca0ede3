package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// modulePath identifies the repository root when --spawn looks for it.
const modulePath = "github.com/mooncake-conductor-go/conductor"

// spawned is a server binary the load generator built and started itself,
// so one command measures everything, --server-pid included.
type spawned struct {
	cmd     *exec.Cmd
	bin     string
	so      serverOptions
	dir     string
	logPath string
	base    string
	exited  chan struct{}
	waitErr error
}

// findRepoRoot walks up from the working directory to the go.mod that
// declares this module.
func findRepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for range 64 { // bounded: a path has far fewer components
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.HasPrefix(bytes.TrimSpace(b), []byte("module "+modulePath+"\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return "", fmt.Errorf("no go.mod for %s above the working directory; pass --repo", modulePath)
}

// freePort asks the kernel for an unused loopback port. Another process may
// take it before the server binds; spawnServer retries then.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// spawnServer builds the server from repo into a temporary directory and
// starts it on a free loopback port with no config file, so a developer's
// ~/.mooncake/conductor_config.json cannot add registrations or change the
// port. The token, when set, is handed over in CONDUCTOR_AUTH_TOKEN.
func spawnServer(ctx context.Context, repo string, so serverOptions) (*spawned, error) {
	dir, bin, err := buildServer(ctx, repo, so)
	if err != nil {
		return nil, err
	}
	srv, err := startRetrying(ctx, dir, bin, so)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return srv, nil
}

// spawnReplicas builds the server once and starts n of it, each in its own
// subdirectory of the build's (its own state directory and log) and on
// its own free port. The returned directory holds them all; the caller
// removes it after stopping every replica. On error nothing is left.
func spawnReplicas(ctx context.Context, repo string, so serverOptions, n int) ([]*spawned, string, error) {
	dir, bin, err := buildServer(ctx, repo, so)
	if err != nil {
		return nil, "", err
	}
	var out []*spawned
	for i := range n {
		sub := filepath.Join(dir, fmt.Sprintf("replica-%d", i+1))
		err := os.Mkdir(sub, 0o700)
		var srv *spawned
		if err == nil {
			srv, err = startRetrying(ctx, sub, bin, so)
		}
		if err != nil {
			for _, s := range out {
				_ = s.stop()
			}
			os.RemoveAll(dir)
			return nil, "", fmt.Errorf("replica %d: %w", i+1, err)
		}
		out = append(out, srv)
	}
	return out, dir, nil
}

// buildServer builds the server from repo into a new temporary directory
// and returns the directory and the binary's path.
func buildServer(ctx context.Context, repo string, so serverOptions) (dir, bin string, err error) {
	dir, err = os.MkdirTemp("", "loadgen-conductor-")
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "conductor")
	args := []string{"build", "-o", bin}
	if so.race {
		args = append(args, "-race")
	}
	build := exec.CommandContext(ctx, "go", append(args, ".")...)
	build.Dir = repo
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	fmt.Fprintf(os.Stderr, "building server in %s\n", repo)
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", "", fmt.Errorf("go build: %w", err)
	}
	return dir, bin, nil
}

// startRetrying starts the binary in dir, on a new free port after a
// failed attempt (another process may take a port before the server binds).
func startRetrying(ctx context.Context, dir, bin string, so serverOptions) (*spawned, error) {
	var lastErr error
	for attempt := range 3 {
		s, err := startServer(ctx, dir, bin, so, attempt)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// serverOptions say how to build and start a spawned server.
type serverOptions struct {
	token    string
	logLevel string
	// race builds the server with the race detector, which makes a soak a
	// hunt for data races in the server too (see raceReport).
	race bool
	// args are appended to the server's command line.
	args []string
	// env is added to the server's environment (KEY=value), after ours.
	env []string
}

func startServer(ctx context.Context, dir, bin string, so serverOptions, attempt int) (*spawned, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, fmt.Sprintf("server-%d.log", attempt))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child keeps its own descriptor
	// The state directory is the run's own (so.args may name another):
	// never the user's default, and never shared between runs.
	cmd := exec.Command(bin, append([]string{"--addr", "127.0.0.1", "--port", strconv.Itoa(port), "--log-level", so.logLevel,
		"--state-dir", filepath.Join(dir, "state")}, so.args...)...)
	env := []string{"CONDUCTOR_CONFIG_PATH=" + filepath.Join(dir, "no-such-config.json")}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONDUCTOR_") {
			env = append(env, kv)
		}
	}
	if so.token != "" {
		env = append(env, "CONDUCTOR_AUTH_TOKEN="+so.token)
	}
	cmd.Env = append(env, so.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If the load generator dies without cleaning up, the kernel kills the
	// server too: nothing is left listening.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &spawned{cmd: cmd, bin: bin, so: so, dir: dir, logPath: logPath, base: fmt.Sprintf("http://127.0.0.1:%d", port), exited: make(chan struct{})}
	go func() { s.waitErr = cmd.Wait(); close(s.exited) }()

	probe, err := newAPI(s.base, "", 1)
	if err != nil {
		s.stop()
		return nil, err
	}
	defer probe.close()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return nil, fmt.Errorf("server exited during start-up (%v): %s", s.waitErr, s.logTail())
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if probe.healthy() {
			return s, nil
		}
	}
	s.stop()
	return nil, fmt.Errorf("server not healthy after 15s: %s", s.logTail())
}

func (s *spawned) pid() int { return s.cmd.Process.Pid }

// logTail returns the last lines of the server's log for error messages.
func (s *spawned) logTail() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-10):], "\n")
}

// stop sends SIGTERM, which the server answers with a graceful shutdown
// within 5 s, and SIGKILL after 8 s. It reports an unclean exit.
func (s *spawned) stop() error {
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(8 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
			return errors.New("server ignored SIGTERM for 8s and was killed")
		}
	}
	if s.waitErr != nil {
		return fmt.Errorf("server exited: %v: %s", s.waitErr, s.logTail())
	}
	return nil
}

// raceReport returns the first data race report in the server's log, or
// "". A race-enabled server reports races as they happen and only fails
// its exit status at the end; the report itself says what raced.
func (s *spawned) raceReport() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return ""
	}
	i := bytes.Index(b, []byte("WARNING: DATA RACE"))
	if i < 0 {
		return ""
	}
	rest := b[i:]
	if j := bytes.Index(rest, []byte("\n==================")); j >= 0 {
		rest = rest[:j]
	}
	const maxReport = 8 << 10
	if len(rest) > maxReport {
		rest = rest[:maxReport]
	}
	return string(rest)
}

// cleanup stops the server and removes the temporary directory.
func (s *spawned) cleanup() error {
	err := s.stop()
	os.RemoveAll(s.dir)
	return err
}
