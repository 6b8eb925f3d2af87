"""Simulator-only host C kernels: AVX2 stand-ins for the array's math at host speed (never on the chip)."""
