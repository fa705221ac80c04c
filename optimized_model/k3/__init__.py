"""K3-mini: a scaled-down model with Kimi K3's architecture — configs, the model and
its standard path, the runner, the embedded engine, and (under fast/) the fast path."""
