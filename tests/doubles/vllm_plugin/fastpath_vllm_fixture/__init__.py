"""A real vLLM plugin for the live vLLM tests: a tiny Llama with a switchable "fast path".

vLLM finds it through its ``vllm.general_plugins`` entry point (the ``fastpath_vllm_fixture``
dist-info beside this package, found when this folder is on ``PYTHONPATH``) and calls
``register()`` in every process it starts: the front end, the engine core, each worker.
"""

ARCH = "FastpathTinyLlamaForCausalLM"


def register() -> None:
    from vllm import ModelRegistry

    if ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCH, "fastpath_vllm_fixture.model:FastpathTinyLlamaForCausalLM")
