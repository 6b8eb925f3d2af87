"""Text embeddings and reranking: embedder, cross-encoder reranker, corpus jobs."""
