"""The ``vllm`` engine: the Engine protocol (fastpath.engine) on vLLM's public Python API.

Registered as the ``vllm`` entry point of ``fastpath.engines``. Importing this package (or
fastpath) never imports vLLM: ``engine.VllmEngine`` imports it when an engine is created, and
says in one line which package to install when it is missing.
"""
