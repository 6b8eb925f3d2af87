"""Subcommands that run a model: serve, generate, embed, rerank, transcribe, upscale."""
