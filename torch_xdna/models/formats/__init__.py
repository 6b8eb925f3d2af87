"""Other tools' checkpoint formats: GGUF (llama.cpp) and its pre-tokenizers, CTranslate2, sentence-transformers folder configs."""
