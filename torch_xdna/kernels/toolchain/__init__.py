"""Designs -> hardware artifacts: the AIE toolchain driver, manifests and the design catalog."""
