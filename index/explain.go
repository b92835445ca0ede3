package index

// StopReason says why an owner's cached run ended where it did.
type StopReason uint8

const (
	// PromptEnd: the owner holds every block of the prompt.
	PromptEnd StopReason = iota
	// KeyAbsent: the block's key is not in the index at all; nobody
	// published it (or its hash differs from the one computed here).
	KeyAbsent
	// HeldByOthers: the block is indexed, but only other owners hold it
	// (another instance or rank, or an owner no longer registered).
	HeldByOthers

	// GroupRule: a hybrid owner's hit ended where one KV-cache group's
	// rule stopped it (OwnerRun.Hybrid names the group).
	GroupRule
)

func (r StopReason) String() string {
	return [...]string{"prompt_end", "key_absent", "held_by_others", "group_rule"}[r]
}

// ExplainedBlock is one block of an explained prompt as the index sees it.
type ExplainedBlock struct {
	Key uint64
	// Tokens is the prompt length the block's end covers.
	Tokens int
	// Indexed reports whether any holder, engine or shared, has the key.
	Indexed bool
	// EngineHolders counts the engine owners holding it (any tier, any
	// instance); Shared is its shared tiers (CPUShare, Disk).
	EngineHolders int
	Shared        TierMask
}

// OwnerRun is one registered (instance, rank)'s answer with its reason:
// Counts is exactly what Query reports for it, and StopBlock the index of
// the first block its widest (disk) run does not reach, len(blocks) when it
// reaches the end.
type OwnerRun struct {
	Instance  string
	Rank      int
	Counts    TierCounts
	StopBlock int
	Reason    StopReason
	// Hybrid is set for an owner with a hybrid layout (docs/hybrid.md):
	// its counts come from the groups' rules, not from the blocks' union.
	Hybrid *HybridRun
}

// HybridRun is how a hybrid owner's answer came about: its layout and, for
// the widest (disk) count, the group whose rule ended the hit (-1 when
// none did: the hit is the prompt's aligned full length).
type HybridRun struct {
	Layout    Layout
	StopGroup int
}

// Explain walks keys (block i covering tokens[i] of the prompt, cumulative)
// for every registered owner, or only those of instance when it is not "",
// and reports each block's state and each owner's run and why it stopped.
// It is the diagnostic twin of Query: it reads every key given instead of
// stopping at the first miss, locks one stripe at a time and allocates
// freely, so it is for operators, never the query path.
func (t *Table) Explain(keys []uint64, tokens []int, instance string) ([]ExplainedBlock, []OwnerRun) {
	v := t.view.Load()
	var owners []int // positions in v.owners being reported
	for _, sp := range v.insts {
		if instance == "" || sp.name == instance {
			for f := sp.lo; f < sp.hi; f++ {
				owners = append(owners, f)
			}
		}
	}
	runs := make([]OwnerRun, len(owners))
	alive := make([][numTiers]bool, len(owners))
	for i, f := range owners {
		runs[i] = OwnerRun{Instance: v.owners[f].instance, Rank: v.owners[f].rank, StopBlock: len(keys)}
		alive[i] = [numTiers]bool{true, true, true, true}
	}
	blocks := make([]ExplainedBlock, len(keys))
	held := make(map[int]uint8) // owner position -> engine tier bits, for one block
	total := 0
	for bi, key := range keys {
		clear(held)
		var shared uint8
		h := mix(key)
		s := t.stripeFor(h)
		s.mu.RLock()
		idx := s.find(key, h)
		if idx >= 0 {
			b := &s.blocks[idx]
			pairs := append([]pair{b.first}, s.overflow(b)...)
			for _, p := range pairs {
				if p.own == 0 {
					continue
				}
				id, m := p.own>>maskBits, uint8(p.own&tierBits)
				if id == 0 {
					shared |= m
					continue
				}
				blocks[bi].EngineHolders++
				if sl := int(id & slotMask); sl < len(v.bySlot) {
					if e := v.bySlot[sl]; uint32(e>>32) == id {
						held[int(uint32(e))] |= m
					}
				}
			}
		}
		s.mu.RUnlock()
		blocks[bi] = ExplainedBlock{Key: key, Tokens: tokens[bi], Indexed: idx >= 0,
			EngineHolders: blocks[bi].EngineHolders, Shared: TierMask(shared) & (1<<CPUShare | 1<<Disk)}
		for i, f := range owners {
			m := held[f]
			dev := m&bitDevice != 0
			loc := dev || m&bitLocal != 0
			sh := loc || shared&bitShare != 0
			has := [numTiers]bool{dev, loc, sh, sh || m&bitDisk != 0 || shared&bitDisk != 0}
			for tier := range alive[i] {
				if alive[i][tier] && !has[tier] {
					alive[i][tier] = false
					setCount(&runs[i].Counts, Tier(tier), total)
					if Tier(tier) == Disk {
						runs[i].StopBlock = bi
						runs[i].Reason = HeldByOthers
						if idx < 0 {
							runs[i].Reason = KeyAbsent
						}
					}
				}
			}
		}
		total = tokens[bi]
	}
	for i := range runs {
		for tier, a := range alive[i] {
			if a {
				setCount(&runs[i].Counts, Tier(tier), total)
			}
		}
	}
	if v.hybrid != nil {
		t.explainHybrid(v, keys, tokens, owners, runs)
	}
	return blocks, runs
}

func setCount(c *TierCounts, t Tier, n int) {
	switch t {
	case Device:
		c.Device = n
	case CPULocal:
		c.CPULocal = n
	case CPUShare:
		c.CPUShare = n
	case Disk:
		c.Disk = n
	}
}
