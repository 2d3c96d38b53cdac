"""The fake command-line tools the provider runs: ``gcloud``, ``gcluster``, and stubs of the tools
gcluster checks for (``terraform``, ``packer``, ``kubectl``, ``gke-gcloud-auth-plugin``)."""
