"""Actions: what happens because of a finding (printing, alerts, stack dumps)."""
