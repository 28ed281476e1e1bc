"""The forward service: one `/api/` request from its buffered body to its envelope (slot,
lease, forward, retry, rewrite); above `edge.pool`, below `edge.web`."""
