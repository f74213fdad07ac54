"""Analysis tools: mini-batch CKA, cost accounting, weight pictures."""
