package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress draws a one-line bar on stderr for phases that take seconds.
// On a terminal it redraws in place a few times a second; when stderr is a
// file or pipe it writes a plain line every few seconds instead, so logs
// stay readable.
type progress struct {
	w        io.Writer
	label    string
	tty      bool
	disabled bool
	last     time.Time
	drawn    bool
}

func newProgress(label string, quiet bool) *progress {
	tty := false
	if fi, err := os.Stderr.Stat(); err == nil {
		tty = fi.Mode()&os.ModeCharDevice != 0
	}
	return &progress{w: os.Stderr, label: label, tty: tty, disabled: quiet}
}

// update draws done out of total, with an optional note.
func (p *progress) update(done, total float64, note string) {
	if p.disabled {
		return
	}
	every := 200 * time.Millisecond
	if !p.tty {
		every = 5 * time.Second
	}
	if time.Since(p.last) < every {
		return
	}
	p.last = time.Now()
	p.drawn = true
	frac := 0.0
	if total > 0 {
		frac = min(max(done/total, 0), 1)
	}
	const width = 30
	n := int(frac * width)
	bar := strings.Repeat("#", n) + strings.Repeat(".", width-n)
	if p.tty {
		fmt.Fprintf(p.w, "\r%-22s [%s] %5.1f%% %s\x1b[K", p.label, bar, 100*frac, note)
	} else {
		fmt.Fprintf(p.w, "%s: %5.1f%% %s\n", p.label, 100*frac, note)
	}
}

// done ends the bar's line.
func (p *progress) done() {
	if p.drawn && p.tty && !p.disabled {
		fmt.Fprintln(p.w)
	}
}
