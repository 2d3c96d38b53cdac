"""Sensors of the TPU RL provider."""
