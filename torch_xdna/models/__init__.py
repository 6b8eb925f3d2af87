"""Model specs as data and Hugging Face loaders."""
