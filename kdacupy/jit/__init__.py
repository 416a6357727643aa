"""Kernel build machinery: render a variant, compile it (NVRTC or the CPU emulation), load it."""
