# Sandbox stand-in for Cluster Toolkit's examples/gke-tpu-v6e/ml-diagnostics-sample-workload-test/sample_workload/sample_workload.py
# (v1.103.0). Shortened: the sandbox never runs it.
"""A sample workload for the ML diagnostics example."""

if __name__ == "__main__":
    print("sample workload (sandbox stand-in)")
