package grpcapi

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// counterValue sums the series of a counter or gauge that carry the label
// name=value (every series when name is "").
func counterValue(t *testing.T, g prometheus.Gatherer, family, name, value string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
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
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
