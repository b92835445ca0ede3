package grpcapi

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// counterValue reads one series (label name/value, or the only series when
// name is "") of a counter or gauge from the registry.
func counterValue(t *testing.T, g prometheus.Gatherer, family, name, value string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != family {
			continue
		}
		for _, m := range f.GetMetric() {
			match := name == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == name && l.GetValue() == value {
					match = true
				}
			}
			if match {
				if m.GetCounter() != nil {
					return m.GetCounter().GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}
