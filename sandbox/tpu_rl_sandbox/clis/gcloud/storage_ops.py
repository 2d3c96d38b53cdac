"""``gcloud storage cp|rsync|ls|rm`` over a :class:`~tpu_rl_sandbox.machines.fsview.Router` (shared by
the fake gcloud and the machines' own)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable

from tpu_rl_sandbox.apis.gcs_client import GcsError, split_gs_url
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, StorageOpError
from tpu_rl_sandbox.machines.fsview import GcsStore, Router, StorageError, basename, join

Write = Callable[[str], None]


def _display(path: str) -> str:
    return path if path.startswith("gs://") else f"file://{path}"


def _files_under(router: Router, path: str) -> list[str]:
    return router.store(path).list_files(path)


def _is_dir(router: Router, path: str) -> bool:
    store = router.store(path)
    if path.startswith("gs://"):
        bucket, key = split_gs_url(path)
        if not key.strip("/"):
            return isinstance(store, GcsStore) and store.bucket_exists(bucket)
    return store.is_dir(path)


def _copy_file(router: Router, src: str, dst: str, err: Write) -> int:
    data = router.store(src).read(src)
    if data is None:
        raise StorageOpError(f"The following URLs matched no objects or files:\n-{src}")
    if dst.startswith("gs://"):
        bucket, _ = split_gs_url(dst)
        gcs = router.gcs
        if not gcs.bucket_exists(bucket):
            raise StorageOpError(f"gs://{bucket} not found: 404.")
    err(f"Copying {_display(src)} to {_display(dst)}\n")
    try:
        router.store(dst).write(dst, data)
    except StorageError as error:
        raise StorageOpError(_short_denied(str(error), dst)) from None
    return len(data)


def _short_denied(message: str, dst: str) -> str:
    if "403" in message or "Forbidden" in message:
        return f"HTTPError 403: {message.split(': ', 2)[-1]}"
    return message


def cp_stdin(router: Router, data: bytes, destination: str, err: Write) -> int:
    """``PROCESS | gcloud storage cp - DST``: a streaming upload of stdin to one object or file."""
    if destination.endswith("/"):
        raise StorageOpError(f"Cannot stream to a container: {_display(destination)}")
    if destination.startswith("gs://"):
        bucket, _ = split_gs_url(destination)
        if not router.gcs.bucket_exists(bucket):
            raise StorageOpError(f"gs://{bucket} not found: 404.")
    err(f"Copying file://- to {_display(destination)}\n")
    try:
        router.store(destination).write(destination, data)
    except StorageError as error:
        raise StorageOpError(_short_denied(str(error), destination)) from None
    err(f"\n  Completed files 1/1 | {len(data)}B\n")
    return len(data)


def cp(router: Router, sources: list[str], destination: str, recursive: bool, err: Write) -> int:
    """``gcloud storage cp [-r] SRC... DST``; returns the number of files copied."""
    count = 0
    total = 0
    dst_is_container = destination.endswith("/") or len(sources) > 1 or _is_dir(router, destination)
    for source in sources:
        source_clean = source.rstrip("/")
        if _is_dir(router, source_clean) and not router.store(source_clean).exists(source_clean):
            if not recursive:
                if source.startswith("gs://"):
                    raise StorageOpError(f"The following URLs matched no objects or files:\n-{source}")
                err(f'Omitting directory "{_display(source_clean)}". (Did you mean to do cp -r?)\n')
                continue
            target_root = (
                join(destination, basename(source_clean)) if dst_is_container else destination.rstrip("/")
            )
            for file in _files_under(router, source_clean):
                relative = file[len(source_clean) + 1 :]
                total += _copy_file(router, file, join(target_root, relative), err)
                count += 1
            continue
        target = join(destination, basename(source_clean)) if dst_is_container else destination
        total += _copy_file(router, source_clean, target, err)
        count += 1
    if count == 0 and not any(_is_dir(router, s) for s in sources):
        raise StorageOpError("The following URLs matched no objects or files:\n-" + "\n-".join(sources))
    err(f"\n  Completed files {count}/{count} | {total}B\n")
    return count


def rsync(
    router: Router,
    source: str,
    destination: str,
    recursive: bool,
    delete_unmatched: bool,
    err: Write,
    exclude: str | None = None,
) -> int:
    """``gcloud storage rsync [-r] [-x REGEX] SRC DST``: make DST's files match SRC's.

    ``--exclude`` is a Python regular expression searched in each path relative to SRC, as gcloud
    documents it; excluded files are neither copied nor deleted.
    """
    pattern = re.compile(exclude) if exclude else None
    source = source.rstrip("/")
    destination = destination.rstrip("/")
    if not _is_dir(router, source):
        raise StorageOpError(f"{_display(source)} does not exist or is not a container.")
    if destination.startswith("gs://"):
        bucket, _ = split_gs_url(destination)
        if not router.gcs.bucket_exists(bucket):
            raise StorageOpError(f"gs://{bucket} not found: 404.")
    err("Building synchronization state...\nStarting synchronization...\n")
    wanted: dict[str, str] = {}
    for file in _files_under(router, source):
        relative = file[len(source) + 1 :]
        if not recursive and "/" in relative:
            continue
        if pattern is not None and pattern.search(relative):
            continue
        wanted[relative] = file
    existing = {f[len(destination) + 1 :]: f for f in _files_under(router, destination)}
    count = 0
    for relative, file in sorted(wanted.items()):
        target = join(destination, relative)
        src_data = router.store(file).read(file)
        if relative in existing and router.store(target).read(target) == src_data:
            continue
        _copy_file(router, file, target, err)
        count += 1
    if delete_unmatched:
        for relative, file in existing.items():
            if relative not in wanted and not (pattern is not None and pattern.search(relative)):
                err(f"Removing {_display(file)}\n")
                _delete(router, file)
    return count


def _check_delete(router: Router, bucket: str, key: str) -> None:
    """A store that checks IAM (a VM's service account) may refuse the delete."""
    check = getattr(router.gcs, "check_delete", None)
    if check is None:
        return
    try:
        check(bucket, key)
    except StorageError as error:
        raise StorageOpError(_short_denied(str(error), f"gs://{bucket}/{key}")) from None


def _delete(router: Router, path: str) -> None:
    if path.startswith("gs://"):
        bucket, key = split_gs_url(path)
        _check_delete(router, bucket, key)
        router.gcs.api.delete(bucket, key)
        return
    local = router.local
    assert local is not None
    local.host_path(path).unlink(missing_ok=True)


def _fmt_time(updated: str) -> str:
    if not updated:
        return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return (
        updated.split(".")[0].replace("+00:00", "") + "Z"
        if not updated.endswith("Z")
        else updated.split(".")[0] + "Z"
    )


def _readable(size: int) -> str:
    value = float(size)
    for unit in ("B", "kiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.2f}{unit}" if unit != "B" else f"{int(value)}B"
        value /= 1024
    return f"{size}B"


def ls(router: Router, urls: list[str], long: bool, recursive: bool, readable: bool, out: Write) -> None:
    """``gcloud storage ls [-l] [-r] URL...``."""
    api = router.gcs.api
    if not urls:
        urls = ["gs://"]
    total_objects = 0
    total_bytes = 0
    for url in urls:
        if url == "gs://":
            for bucket in sorted(b["name"] for b in api.list_buckets()):
                out(f"gs://{bucket}/\n")
            continue
        bucket, key = split_gs_url(url)
        if api.get_bucket(bucket) is None:
            raise StorageOpError(f"gs://{bucket} not found: 404.")
        prefix = key
        try:
            if recursive:
                objects = list(api.iter_objects(bucket, prefix))
                if not objects:
                    raise StorageOpError("One or more URLs matched no objects.")
                for info in objects:
                    total_objects += 1
                    total_bytes += info.size
                    out(_ls_line(info.bucket, info.name, info.size, info.updated, long, readable))
                continue
            objects, prefixes = api.list_level(bucket, prefix)
            if key and not key.endswith("/") and not objects and f"{key}/" in prefixes:
                objects, prefixes = api.list_level(bucket, key + "/")
            exact = [o for o in objects if o.name == key]
            if key and not key.endswith("/") and exact:
                objects, prefixes = exact, []
        except GcsError as error:
            raise StorageOpError(str(error)) from None
        if not objects and not prefixes:
            raise StorageOpError("One or more URLs matched no objects.")
        for info in objects:
            total_objects += 1
            total_bytes += info.size
            out(_ls_line(info.bucket, info.name, info.size, info.updated, long, readable))
        for sub in prefixes:
            out(f"{'':>34}gs://{bucket}/{sub}\n" if long else f"gs://{bucket}/{sub}\n")
    if long:
        size_text = _readable(total_bytes) if readable else f"{total_bytes} bytes ({_readable(total_bytes)})"
        out(f"TOTAL: {total_objects} objects, {size_text}\n")


def _ls_line(bucket: str, name: str, size: int, updated: str, long: bool, readable: bool) -> str:
    url = f"gs://{bucket}/{name}"
    if not long:
        return url + "\n"
    size_text = _readable(size) if readable else str(size)
    return f"{size_text:>10}  {_fmt_time(updated)}  {url}\n"


def rm(router: Router, urls: list[str], recursive: bool, err: Write) -> int:
    """``gcloud storage rm [-r] URL...``; with ``-r`` on a bucket URL also deletes the bucket."""
    api = router.gcs.api
    removed = 0
    for url in urls:
        bucket, key = split_gs_url(url)
        if api.get_bucket(bucket) is None:
            raise StorageOpError(f"gs://{bucket} not found: 404.")
        if recursive:
            prefix = key.rstrip("/") + "/" if key.strip("/") else ""
            names = [info.name for info in api.iter_objects(bucket, prefix)]
            if key.strip("/") and api.exists(bucket, key):
                names.append(key)
        else:
            names = [key] if key and api.exists(bucket, key) else []
        if not names and (key or not recursive):
            raise StorageOpError("The following URLs matched no objects or files:\n-" + url)
        for name in names:
            _check_delete(router, bucket, name)
            err(f"Removing objects:\nRemoving gs://{bucket}/{name}...\n")
            api.delete(bucket, name)
            removed += 1
        if recursive and not key.strip("/"):
            err(f"Removing buckets:\nRemoving gs://{bucket}/...\n")
            api.delete_bucket(bucket)
    return removed


def cp_from_stdin(
    router: Router, sources: list[str], to_path: Callable[[str], str], data: bytes, err: Write
) -> int:
    """``gcloud storage cp - DST``: ``-`` must be the only source (gcloud's streaming upload)."""
    if len(sources) != 2:
        raise GcloudError(
            "argument DESTINATION: Must be specified."
            if len(sources) < 2
            else "Multiple URL strings are not supported when transferring from stdin.",
            code=2 if len(sources) < 2 else 1,
        )
    cp_stdin(router, data, to_path(sources[1]), err)
    return 0
