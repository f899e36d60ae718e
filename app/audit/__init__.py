"""The audit trail: one append-only row per decision or outcome (SPEC §7)."""
