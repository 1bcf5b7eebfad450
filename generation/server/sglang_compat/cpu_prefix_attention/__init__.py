"""Extend (prefill) attention for SGLang's ``torch_native`` backend that attends only the new
query rows to the cached keys (SGLang server process only, CPU only).

SGLang 0.5.23's ``TorchNativeAttnBackend._run_sdpa_forward_extend`` pads each request's query
back to the whole sequence and runs full causal attention over prefix + new tokens, so a
RadixAttention hit saves the projections and the MLP but not the attention. ``kernel`` computes
the same rows for the new tokens only, with a bottom-right-aligned causal mask; ``hook`` swaps it
in when SGLang imports the backend, pinned to one SGLang version and switched off by
``ANSWER_SGLANG_CPU_PREFIX_ATTENTION=0``. ``sitecustomize`` (one folder up) installs the hook.

May import: the standard library (``hook``) and torch (``kernel``, loaded only when patching).
Nothing in the main project imports this package.
"""
