"""``gcloud storage``: buckets (create, describe, list, IAM policy) and objects (``cp``, ``rsync``,
``ls``, ``rm``, over :mod:`~tpu_rl_sandbox.clis.gcloud.storage_ops`)."""

from __future__ import annotations

import re
from pathlib import Path

from tpu_rl_sandbox.clis.gcloud import storage_ops
from tpu_rl_sandbox.clis.gcloud.iam_policy import IamPolicies
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted, matches_filter
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.clis.gcloud.storage_ops import cp_from_stdin
from tpu_rl_sandbox.world import iam
from tpu_rl_sandbox.world.timestamps import rfc3339


class StorageCommands(IamPolicies):
    """``gcloud storage``."""

    def cmd_storage_buckets_create(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        location = str(parsed.get("location") or "US").upper()
        api = self.router.gcs.api
        for url in parsed.positionals["URL"]:
            if not url.startswith("gs://"):
                raise GcloudError(f"Expected a bucket URL (gs://bucket), got [{url}].")
            bucket = url[len("gs://") :].rstrip("/")
            if "/" in bucket or not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]", bucket):
                raise GcloudError(f"HTTPError 400: Invalid bucket name: '{bucket}'")
            self.err(f"Creating gs://{bucket}/...\n")
            with self.store.txn() as txn:
                buckets = txn.doc("buckets")
                if api.get_bucket(bucket) is not None:
                    # Cloud Storage's two 409s: a name another project holds (the XML API's
                    # BucketNameUnavailable text, the JSON API's "Error 409: ..., conflict" as
                    # googleapi relays it: GoogleCloudPlatform/mlops-with-vertex-ai issue 26), and
                    # a bucket of the request's project (cloud.google.com/storage/docs/json_api/v1/
                    # status-codes, "409 Conflict"). gcloud storage prints "HTTPError 409: <message>".
                    owner = buckets.get(bucket, {}).get("project", project)
                    if owner != project:
                        raise GcloudError(
                            "HTTPError 409: The requested bucket name is not available. The bucket namespace is shared "
                            "by all users of the system. Please select a different name and try again."
                        )
                    raise GcloudError(
                        "HTTPError 409: Your previous request to create the named bucket succeeded and you already own it."
                    )
                api.create_bucket(bucket, location)
                buckets[bucket] = {"project": project, "location": location, "created": rfc3339()}
                txn.save("buckets")
        return 0

    def cmd_storage_buckets_describe(self, parsed: GcloudParse) -> int:
        url = str(parsed.positionals["URL"])
        bucket = url[len("gs://") :].rstrip("/") if url.startswith("gs://") else url
        meta = self.router.gcs.api.get_bucket(bucket)
        if meta is None:
            raise GcloudError(f"gs://{bucket} not found: 404.")
        record = self.store.read("buckets").get(bucket, {})
        created = record.get("created") or meta.get("timeCreated", rfc3339())
        resource = {
            "creation_time": created,
            "default_storage_class": meta.get("storageClass", "STANDARD"),
            "location": record.get("location") or meta.get("location", "US"),
            "location_type": "region",
            "metageneration": 1,
            "name": bucket,
            "storage_url": f"gs://{bucket}/",
            "uniform_bucket_level_access": True,
            "update_time": created,
        }
        self.out(formatted(resource, parsed.get("format")))
        return 0

    def cmd_storage_buckets_list(self, parsed: GcloudParse) -> int:
        records = self.store.read("buckets")
        project = parsed.get("project") or self.env.get("CLOUDSDK_CORE_PROJECT")
        rows = []
        for meta in self.router.gcs.api.list_buckets():
            record = records.get(meta["name"], {})
            if project and record.get("project", project) != project:
                continue
            resource = {
                "name": meta["name"],
                "storage_url": f"gs://{meta['name']}/",
                "location": record.get("location", "US"),
            }
            if matches_filter(resource, parsed.get("filter")):
                rows.append(resource)
        self.out(formatted(rows, parsed.get("format")))
        return 0

    def cmd_storage_ls(self, parsed: GcloudParse) -> int:
        storage_ops.ls(
            self.router,
            list(parsed.positionals["PATH"]),
            bool(parsed.get("long")),
            bool(parsed.get("recursive")),
            bool(parsed.get("readable-sizes")),
            self.out,
        )
        return 0

    def cmd_storage_rm(self, parsed: GcloudParse) -> int:
        storage_ops.rm(self.router, list(parsed.positionals["URLS"]), bool(parsed.get("recursive")), self.err)
        return 0

    def _local(self, path: str) -> str:
        return path if path.startswith("gs://") else str(Path(path).expanduser().resolve())

    def cmd_storage_cp(self, parsed: GcloudParse) -> int:
        if list(parsed.positionals["SOURCE"])[:1] == ["-"]:
            return cp_from_stdin(
                self.router, list(parsed.positionals["SOURCE"]), self._local, self.read_stdin(), self.err
            )
        items = [self._local(p) for p in parsed.positionals["SOURCE"]]
        if len(items) < 2:
            raise GcloudError("argument DESTINATION: Must be specified.", code=2)
        trailing = "/" if parsed.positionals["SOURCE"][-1].endswith("/") else ""
        storage_ops.cp(self.router, items[:-1], items[-1] + trailing, bool(parsed.get("recursive")), self.err)
        return 0

    def cmd_storage_rsync(self, parsed: GcloudParse) -> int:
        items = [self._local(p) for p in parsed.positionals["SOURCE"]]
        if len(items) != 2:
            raise GcloudError("rsync requires exactly one SOURCE and one DESTINATION.", code=2)
        storage_ops.rsync(
            self.router,
            items[0],
            items[1],
            bool(parsed.get("recursive")),
            bool(parsed.get("delete-unmatched-destination-objects")),
            self.err,
            exclude=parsed.get("exclude") or None,
        )
        return 0

    def _bucket_of(self, parsed: GcloudParse) -> str:
        url = str(parsed.positionals["URL"])
        command = " ".join(["gcloud", *parsed.command.path])
        if not url.startswith("gs://"):
            # command_lib/storage/errors_util.raise_error_if_not_gcs_bucket
            raise GcloudError(
                f'"{command}" only accepts Google Cloud Storage URLs.\nExample: "gs://bucket"\nReceived: "{url}"'
            )
        bucket = url[len("gs://") :].rstrip("/")
        if not bucket or "/" in bucket:
            raise GcloudError(
                f'"{command}" only accepts bucket URLs.\nExample: "gs://bucket"\nReceived: "{url}"'
            )
        if self.router.gcs.api.get_bucket(bucket) is None:
            raise GcloudError("HTTPError 404: The specified bucket does not exist.")
        return bucket

    def cmd_storage_buckets_add_iam_policy_binding(self, parsed: GcloudParse) -> int:
        """surface/storage/buckets/add_iam_policy_binding.py: the bucket must exist; the binding is
        added with iam_util.AddBindingToIamPolicyWithCondition (no --condition on a policy with a
        conditional binding is refused non-interactively), then the policy is set."""
        member, role = str(parsed.get("member")), str(parsed.get("role"))
        specified, condition = self._condition(parsed, role)
        bucket = self._bucket_of(parsed)
        _, conditional = iam.iam_policy(self.layout, f"b/{bucket}")
        self._refuse_unconditional(conditional, specified, condition)
        self._check_role(role)
        self._check_member(member, "")
        with self.store.txn() as txn:
            buckets = txn.doc("buckets")
            record = buckets.setdefault(bucket, {})
            self._bind_in_record(record, member, role, condition)
            txn.save("buckets")
            plain, conditional = iam.policy_from_docs({"buckets": buckets}, f"b/{bucket}", False)
        self.out(formatted(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def cmd_storage_buckets_remove_iam_policy_binding(self, parsed: GcloudParse) -> int:
        """surface/storage/buckets/remove_iam_policy_binding.py: the bucket URL checked, its policy
        read (a missing bucket is a 404), then iam_command_util.remove_iam_binding_from_resource:
        iam_util.RemoveBindingFromIamPolicyWithCondition and the policy set."""
        member, role = str(parsed.get("member")), str(parsed.get("role"))
        bucket = self._bucket_of(parsed)
        remove_all, specified, condition = self._removal(parsed, role)
        with self.store.txn() as txn:
            buckets = txn.doc("buckets")
            record = buckets.setdefault(bucket, {})
            self._unbind_in_record(
                record, member, role, condition, specified=specified, remove_all=remove_all
            )
            txn.save("buckets")
            plain, conditional = iam.policy_from_docs({"buckets": buckets}, f"b/{bucket}", False)
        self.out(formatted(self._policy(plain, conditional), parsed.get("format")))
        return 0

    def cmd_storage_buckets_get_iam_policy(self, parsed: GcloudParse) -> int:
        bucket = self._bucket_of(parsed)
        plain, conditional = iam.iam_policy(self.layout, f"b/{bucket}")
        self.out(formatted(self._policy(plain, conditional), parsed.get("format")))
        return 0
