// Command conductor is a drop-in replacement for Mooncake Conductor: it
// subscribes to KV-cache events from inference engines and the Mooncake
// Store master and tells routers where a prompt's KV cache already lives.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/mooncake-conductor-go/conductor/internal/buildinfo"
	"github.com/mooncake-conductor-go/conductor/internal/config"
	"github.com/mooncake-conductor-go/conductor/subscriber"
)

func main() {
	// Every verb but serve runs and exits here (verbs.go).
	args, code, done := runVerb(os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	if done {
		os.Exit(code)
	}
	if err := run(args); err != nil {
		fmt.Fprintln(os.Stderr, "conductor:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cfg, err := config.Load(args, os.Getenv)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Print(usage())
		return nil
	case err != nil:
		return fmt.Errorf("%w (see conductor --help)", err)
	case cfg.ShowVersion:
		fmt.Println(buildinfo.Get())
		return nil
	}
	// A pebbe/zmq4 the event receive path was not written for would be
	// misread; refuse to serve, while --version and the subcommands above
	// still run.
	bi, _ := debug.ReadBuildInfo()
	if err := subscriber.CheckZMQBinding(bi); err != nil {
		return err
	}
	setGCPercent(os.Getenv)
	// Signals are caught before anything listens, so a SIGTERM that
	// follows the "listening" log line always takes the graceful path. Two
	// fit in the buffer: the one that starts the shutdown and the one
	// that cuts it short.
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	a, err := newApp(cfg, newLogger(cfg, os.Stderr, isatty.IsTerminal(os.Stderr.Fd())))
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- a.serve() }()
	select {
	case err := <-served:
		return errors.Join(fmt.Errorf("serve: %w", err), shutdown(a, sig))
	case <-sig:
	}
	return shutdown(a, sig)
}

// shutdown closes the app within shutdownTimeout. Its error, and so a
// non-zero exit status, says the shutdown did not finish cleanly: a step
// failed (the last snapshot not written), it ran out of time, or a second
// signal ended the process at once.
func shutdown(a *app, sig <-chan os.Signal) error {
	a.log.Info().Msg("shutting down")
	done := make(chan error, 1)
	go func() { done <- a.close() }()
	watchdog := time.NewTimer(shutdownTimeout)
	defer watchdog.Stop()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("shutdown: %w", err)
		}
		a.log.Info().Msg("shut down")
		return nil
	case s := <-sig:
		a.log.Warn().Str("signal", s.String()).Msg("second signal during shutdown; exiting now, without waiting for the rest of it")
		return fmt.Errorf("shutdown cut short by a second %s", s)
	case <-watchdog.C:
		a.log.Error().Dur("after", shutdownTimeout).Msg("shutdown did not finish in time; exiting")
		return fmt.Errorf("shutdown did not finish within %v", shutdownTimeout)
	}
}

// newLogger writes to out: JSON, or with --log-format console a line per
// event for people, coloured only when tty says out is a terminal (escape
// codes in a file or a log collector are noise).
func newLogger(cfg *config.Config, out io.Writer, tty bool) zerolog.Logger {
	zerolog.SetGlobalLevel(cfg.LogLevel)
	var w = zerolog.New(out)
	if cfg.LogFormat == "console" {
		w = zerolog.New(zerolog.ConsoleWriter{Out: out, TimeFormat: time.RFC3339, NoColor: !tty})
	}
	return w.Level(cfg.LogLevel).With().Timestamp().Logger()
}

// defaultGCPercent is the GC target the service runs with unless GOGC is
// set. The index is a large, long-lived, pointer-free heap, so collections
// are cheap to run and the default 100 % mostly buys headroom: unbounded,
// the resident size at the end of a burst is lower at 50 with no visible
// change in CPU; under a memory budget the soft limit alone lets the heap
// overshoot it during a flood, and 50 keeps the peak within the limit at
// the cost of ingest rate (BENCHMARKS.md, "Memory budget and caches").
const defaultGCPercent = 50

// setGCPercent applies defaultGCPercent unless the operator chose GOGC.
func setGCPercent(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
}
