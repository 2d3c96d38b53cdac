"""The fake cloud's state on disk: the sandbox folder, the state documents and their inventory,
IAM, secrets, the VPC, settings, faults, the call log and the time scale."""
