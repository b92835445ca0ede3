package main

// Reading the server's /metrics during and after the soak.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// metrics fetches and parses GET /metrics, counting a 5xx answer.
func (r *soakRun) metrics() (promText, error) {
	m, status, err := r.api.metrics()
	if status >= 500 {
		r.counts.fiveXX.Add(1)
	}
	return m, err
}

// serverCounts reads the server's own view at the end: 5xx responses it
// counted on every endpoint, and stale sources now.
func (r *soakRun) serverCounts(rep *soakReport) error {
	m, err := r.metrics()
	if err != nil {
		return err
	}
	rep.ServerFiveXX = 0
	for _, s := range m["conductor_http_requests_total"] {
		if strings.HasPrefix(s.labels["status"], "5") {
			rep.ServerFiveXX += int64(s.value)
		}
	}
	rep.FinalStale = int64(m.value("conductor_stale_sources", nil))
	all, regr := staleTransitions(m)
	rep.StaleTransitions, rep.StaleRegressions = all-r.staleAtStart[0], regr-r.staleAtStart[1]
	return nil
}

// staleTransitions sums conductor_stale_transitions_total over every
// series, and over those for a sequence regression.
func staleTransitions(m promText) (all, regression int64) {
	for _, s := range m["conductor_stale_transitions_total"] {
		all += int64(s.value)
		if s.labels["reason"] == "regression" {
			regression += int64(s.value)
		}
	}
	return all, regression
}

// promSample is one series of a Prometheus text exposition.
type promSample struct {
	labels map[string]string
	value  float64
}

// promText maps metric names to their series.
type promText map[string][]promSample

// value returns the value of the series of name whose labels include
// want, or -1.
func (m promText) value(name string, want map[string]string) float64 {
outer:
	for _, s := range m[name] {
		for k, v := range want {
			if s.labels[k] != v {
				continue outer
			}
		}
		return s.value
	}
	return -1
}

// sum adds every series of name (0 when there is none).
func (m promText) sum(name string) float64 {
	t := 0.0
	for _, s := range m[name] {
		t += s.value
	}
	return t
}

// parsePromText reads the text exposition format: `name{k="v",...} value`
// per line, comments skipped. Timestamps after the value are ignored.
func parsePromText(b []byte) (promText, error) {
	out := promText{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		labels := map[string]string{}
		if i := strings.IndexByte(line, '{'); i >= 0 {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return nil, fmt.Errorf("metrics: bad line %q", line)
			}
			name, rest = line[:i], line[j+1:]
			if err := parseLabels(line[i+1:j], labels); err != nil {
				return nil, fmt.Errorf("metrics: %w in %q", err, line)
			}
		} else if i := strings.IndexAny(line, " \t"); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: value in %q: %w", line, err)
		}
		out[name] = append(out[name], promSample{labels: labels, value: v})
	}
	return out, sc.Err()
}

// parseLabels reads k="v" pairs with the format's escapes (\\, \", \n).
func parseLabels(s string, out map[string]string) error {
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimLeft(strings.TrimSpace(s), ",") {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return errors.New("bad label")
		}
		key := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default:
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return errors.New("unterminated label value")
		}
		out[key] = val.String()
		s = s[i+1:]
	}
	return nil
}
