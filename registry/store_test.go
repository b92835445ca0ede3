package registry

import (
	"errors"
	"testing"
)

// TestCheckMatchesApply holds the shared store's rules to the registry's:
// for every case, Check on the existing set and Apply on a registry holding
// that set agree on success, identity and the kind of error.
func TestCheckMatchesApply(t *testing.T) {
	base := []Service{svc(t, "a", 0, "tcp://127.0.0.1:5000"), svc(t, "b", 0, "tcp://127.0.0.1:5001")}
	otherModel := svc(t, "c", 0, "tcp://127.0.0.1:5002")
	otherModel.ModelName = "other"
	otherProfile := svc(t, "c", 0, "tcp://127.0.0.1:5002")
	otherProfile.Profile = profile(t, "1")
	otherProfileOtherCtx := otherProfile
	otherProfileOtherCtx.ModelName = "other"
	diffConfig := svc(t, "a", 0, "tcp://127.0.0.1:5000")
	diffConfig.BlockSize = 32
	zero := 0
	groupZero := svc(t, "a", 0, "tcp://127.0.0.1:5000")
	groupZero.CacheGroup = &zero
	cases := []struct {
		name      string
		svc       Service
		max       int
		identical bool
		conflict  bool
		full      bool
	}{
		{name: "new", svc: svc(t, "c", 0, "tcp://127.0.0.1:5002")},
		{name: "new rank", svc: svc(t, "a", 1, "tcp://127.0.0.1:5003")},
		{name: "identical", svc: base[0], identical: true},
		{name: "identical with group 0", svc: groupZero, identical: true},
		{name: "same key other config", svc: diffConfig, conflict: true},
		{name: "endpoint of another", svc: svc(t, "c", 0, "tcp://127.0.0.1:5001"), conflict: true},
		{name: "other profile same context", svc: otherProfile, conflict: true},
		{name: "other profile other context", svc: otherProfileOtherCtx},
		{name: "other model", svc: otherModel},
		{name: "full", svc: svc(t, "c", 0, "tcp://127.0.0.1:5002"), max: 2, full: true},
		{name: "identical when full", svc: base[1], max: 2, identical: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			identical, err := Check(base, tc.svc, tc.max)
			r, _ := newReg(&factory{}, tc.max)
			for _, s := range base {
				if _, err := r.Apply(s); err != nil {
					t.Fatal(err)
				}
			}
			changed, aerr := r.Apply(tc.svc)
			var ce *ConflictError
			switch {
			case tc.conflict:
				if !errors.As(err, &ce) || !errors.As(aerr, &ce) {
					t.Fatalf("want conflicts, got Check %v, Apply %v", err, aerr)
				}
			case tc.full:
				if !errors.Is(err, ErrTooManyServices) || !errors.Is(aerr, ErrTooManyServices) {
					t.Fatalf("want full, got Check %v, Apply %v", err, aerr)
				}
			default:
				if err != nil || aerr != nil {
					t.Fatalf("want success, got Check %v, Apply %v", err, aerr)
				}
				if identical != tc.identical || changed == tc.identical {
					t.Fatalf("identical: Check %v, Apply changed %v, want identical %v", identical, changed, tc.identical)
				}
			}
			if err != nil && aerr != nil && err.Error() != aerr.Error() {
				t.Fatalf("messages differ: Check %q, Apply %q", err, aerr)
			}
		})
	}
}

type countingStore struct{ regs, unregs int }

func (c *countingStore) Register(Service) (bool, error) { c.regs++; return true, nil }
func (c *countingStore) Unregister(ServiceKey) error    { c.unregs++; return nil }

// TestStoreTakesChanges: with a store set, Register and Unregister go to
// it and leave the registry alone; Apply and Remove change the registry.
func TestStoreTakesChanges(t *testing.T) {
	f := &factory{}
	r, _ := newReg(f, 0)
	st := &countingStore{}
	r.SetStore(st)
	s := svc(t, "a", 0, "tcp://127.0.0.1:5000")
	if _, err := r.Register(s); err != nil {
		t.Fatal(err)
	}
	if err := r.Unregister(s.Key()); err != nil {
		t.Fatal(err)
	}
	if st.regs != 1 || st.unregs != 1 || len(r.Services()) != 0 {
		t.Fatalf("store saw %d/%d, registry holds %d", st.regs, st.unregs, len(r.Services()))
	}
	if _, err := r.Apply(s); err != nil || len(r.Services()) != 1 {
		t.Fatalf("Apply: %v, %d services", err, len(r.Services()))
	}
	if err := r.Remove(s.Key()); err != nil || len(r.Services()) != 0 {
		t.Fatalf("Remove: %v, %d services", err, len(r.Services()))
	}
	r.SetStore(nil)
	if _, err := r.Register(s); err != nil || len(r.Services()) != 1 || st.regs != 1 {
		t.Fatalf("without a store: %v, %d services, store saw %d", err, len(r.Services()), st.regs)
	}
}
