"""Who may do what, and the record of it: tokens and identities, capability links, the one gate every door passes, the path guard, the audit trail and the metrics."""
