"""The ``tpu-rl`` command line."""

def main() -> int:
    return 0
