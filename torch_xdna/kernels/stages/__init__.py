"""Fused blocks as the stages their array programs run (one module per block family: the
stage list, scratch buffers, host layout and the functional reference in stage order, which
the transaction level and the emulated NPU equal bit for bit). kernels/lower/ turns them into
ArrayPrograms; kernels/blocks/ holds the blocks' math and plans."""
