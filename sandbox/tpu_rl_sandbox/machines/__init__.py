"""The fake machines that run the rendered scripts with real bash: GKE pods, TPU and CPU VMs, a
VM's docker containers; the detached workers that play them; the simulated MaxText."""
