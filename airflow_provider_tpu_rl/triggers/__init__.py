"""Deferrable triggers of the TPU RL provider."""
