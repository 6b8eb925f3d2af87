"""Endpoint families: one module each, exposing `register(app, srv)`."""
