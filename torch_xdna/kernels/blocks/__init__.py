"""Fused model blocks: the few designs a model's forward runs through (LLM, encoder, Whisper)."""
