"""Image models: image embeddings, super-resolution, their cost estimates."""
