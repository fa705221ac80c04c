"""K3-mini: a scaled-down model with Kimi K3's architecture (DESIGN §7) — configs, the model and
its standard path, the runner, the embedded engine, and (under fast/) the fast path."""
