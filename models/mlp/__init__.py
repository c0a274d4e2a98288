"""The README example: a 2-layer MLP on named dimensions (batch, rows, cols, hidden, classes)."""
