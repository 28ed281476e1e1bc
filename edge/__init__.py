"""The public gateway: pool, dispatch, forwarding, image rewrite, monitor, request log."""
