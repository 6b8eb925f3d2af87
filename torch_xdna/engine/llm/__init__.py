"""Decoder LLMs: fused decoder, generation loop, KV and prefix caches, batching, sampling."""
