"""The `xdna` command."""
