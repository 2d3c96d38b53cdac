"""Jobs: Kueue admission, the three MaxText programs, logs, TTL, cancel."""

from __future__ import annotations

import json
import os
import struct
import threading
from pathlib import Path

from airflow_provider_tpu_rl.render.shell import hf_token_from_secret_manager
from tests.sandbox.conftest import Cli, Cluster, job_status, submit_args, wait_for

CONVERT = (
    '[ "$JOB_COMPLETION_INDEX" != "0" ] || {token} && python3 -m maxtext.checkpoint_conversion.to_maxtext '
    "model_name=qwen3-30b-a3b --hf_model_path='Qwen/Qwen3-30B-A3B-Instruct-2507' "
    "base_output_directory=gs://{bucket}/qwen/max-text-format/ scan_layers=True use_multimodal=False "
    "skip_jax_distributed_system=true checkpoint_storage_use_zarr3=0 checkpoint_storage_use_ocdbt=0 hardware=cpu "
    "--lazy_load_tensors=True"
)
TRAIN = (
    "export VLLM_HOST_IP=$(hostname -I | awk '{{print $1}}') && {token} && "
    "JAX_PLATFORMS=proxy,cpu ENABLE_PATHWAYS_PERSISTENCE=1 python3 -m maxtext.trainers.post_train.rl.train_rl "
    "run_name=rl base_output_directory=gs://{bucket}/qwen/trained/ model_name=qwen3-30b-a3b "
    "load_parameters_path=gs://{bucket}/qwen/max-text-format/0/items/ num_batches={steps} "
    "checkpoint_period={period} num_test_batches={tests} eval_interval=2 batch_size=4 rl.num_generations=4"
)
EXPORT = (
    '[ "$JOB_COMPLETION_INDEX" != "0" ] || {token} && python3 -m maxtext.checkpoint_conversion.to_huggingface '
    "model_name=qwen3-30b-a3b load_parameters_path=gs://{bucket}/qwen/trained/rl/checkpoints/actor/{step}/model_params/ "
    "base_output_directory=gs://{bucket}/qwen/hf-trained/ skip_jax_distributed_system=true hardware=cpu "
    "scan_layers=True use_multimodal=False weight_dtype=bfloat16 --override_model_architecture"
)
PATHWAYS = [
    "--pathways",
    "--restarts",
    "0",
    "--gke-ttl-after-finished",
    "24h",
    "--env",
    "GRPC_DNS_RESOLVER=native",
]


def read_secret_python(resource: str) -> str:
    """The ``python3 -c ...`` part of the renderer's Secret Manager read."""
    return hf_token_from_secret_manager(resource).split("=", 1)[1].split(") && export", 1)[0][2:]


def convert(cli: Cli, cluster: Cluster, name: str = "qwen-hf-to-mt") -> None:
    result = cli.gcluster(
        *submit_args(
            name,
            CONVERT.format(token=cluster.token_export(), bucket=cluster.bucket),
            "--await-job-completion",
        )
    )
    assert result.code == 0, result.text


def train_command(cluster: Cluster, steps: int, period: int, tests: int = 2) -> str:
    return TRAIN.format(
        token=cluster.token_export(), bucket=cluster.bucket, steps=steps, period=period, tests=tests
    )


def pathways_flags(cluster: Cluster) -> list[str]:
    return [*PATHWAYS, "--pathways-gcs-location", f"gs://{cluster.bucket}/pathways/"]


def logs(cli: Cli, name: str) -> str:
    result = cli.gcluster("job", "logs", name, "--main-only")
    assert result.code == 0, result.text
    return result.err  # cobra's cmd.Println goes to stderr


def test_convert_train_export_pipeline(cli: Cli, cluster: Cluster) -> None:
    convert(cli, cluster)
    converted = cli.objects(cluster.bucket, "qwen/max-text-format/")
    assert "qwen/max-text-format/0/commit_success.txt" in converted
    assert "qwen/max-text-format/0/items/_METADATA" in converted
    assert "qwen/max-text-format/0/_CHECKPOINT_METADATA" in converted

    trained = cli.gcluster(
        *submit_args(
            "qwen-rl",
            train_command(cluster, steps=4, period=2),
            *pathways_flags(cluster),
            "--await-job-completion",
        )
    )
    assert trained.code == 0, trained.text
    text = logs(cli, "qwen-rl")
    pre = next(line for line in text.splitlines() if "Pre RL Training: corr=" in line)
    post = next(line for line in text.splitlines() if "Post RL Training: corr=" in line)
    assert float(post.rsplit("mean_reward=", 1)[1]) > float(pre.rsplit("mean_reward=", 1)[1])
    assert (
        text.index("Starting RL training...")
        < text.index("Train step 1 training loss:")
        < text.index("RL Training Completed Successfully!")
    )
    assert text.count("Reshard finished in") == 4
    assert "Intermediate Eval (step=2): corr=" in text
    actor = "qwen/trained/rl/checkpoints/actor/"
    for step in (2, 4):
        assert f"{actor}{step}/commit_success.txt" in cli.objects(cluster.bucket, actor)
        assert f"{actor}{step}/optimizer_state/_METADATA" in cli.objects(cluster.bucket, actor)

    exported = cli.gcluster(
        *submit_args(
            "qwen-mt-to-hf",
            EXPORT.format(token=cluster.token_export(), bucket=cluster.bucket, step=4),
            "--await-job-completion",
        )
    )
    assert exported.code == 0, exported.text
    files = {name.rsplit("/", 1)[1] for name in cli.objects(cluster.bucket, "qwen/hf-trained/")}
    assert {
        "chat_template.jinja",
        "config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= files
    assert not {"generation_config.json", "special_tokens_map.json"} & files
    index = json.loads(cli.api.download(cluster.bucket, "qwen/hf-trained/model.safetensors.index.json"))
    shards = sorted(f for f in files if f.endswith(".safetensors"))
    assert sorted(set(index["weight_map"].values())) == shards
    assert len(shards) == 19  # qwen3-30b-a3b's 61 GB of bf16 tensors in shards of at most 3 GiB
    for shard in shards:
        data = cli.api.download(cluster.bucket, f"qwen/hf-trained/{shard}")
        header_size = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8 : 8 + header_size])
        assert {k for k in header if k != "__metadata__"} == {
            k for k, v in index["weight_map"].items() if v == shard
        }
    assert index["metadata"]["total_size"] == 61_064_245_248  # the real tensors' bytes, not the files'


def test_status_suspended_while_kueue_queues_then_running_then_succeeded(
    cli: Cli, cluster: Cluster, tmp_path: Path
) -> None:
    convert(cli, cluster)
    hold = tmp_path / "hold"
    hold.touch()
    held = {"TPU_RL_SANDBOX_HOLD_FILE": str(hold)}
    first = cli.gcluster(
        *submit_args("first-rl", train_command(cluster, steps=2, period=2), *pathways_flags(cluster)),
        env=held,
    )
    assert first.code == 0, first.text
    second = cli.gcluster(*submit_args("second-job", "echo second"))
    assert second.code == 0, second.text
    actor = "qwen/trained/rl/checkpoints/actor/2/"
    wait_for(
        lambda: f"{actor}optimizer_state/_METADATA" in cli.objects(cluster.bucket, actor),
        what="step 2 content",
    )
    # A step being written: content present, commit markers (the items', then the step's) not yet.
    in_progress = cli.objects(cluster.bucket, actor)
    assert f"{actor}model_params/_METADATA" in in_progress
    assert f"{actor}model_params/commit_success.txt" not in in_progress
    assert f"{actor}commit_success.txt" not in in_progress
    listed = cli.gcluster("job", "list")
    rows = {line.split()[0]: line.split()[1] for line in listed.out.splitlines()[2:]}
    assert rows == {"qwen-hf-to-mt": "Succeeded", "first-rl": "Running", "second-job": "Suspended"}
    hold.unlink()
    wait_for(lambda: job_status(cli, cluster, "first-rl") == "Succeeded", what="training to finish")
    assert f"{actor}commit_success.txt" in cli.objects(cluster.bucket, actor)
    assert set(in_progress) <= set(cli.objects(cluster.bucket, actor))
    wait_for(lambda: job_status(cli, cluster, "second-job") == "Succeeded", what="queued job to run")


def test_list_table_matches_tabwriter_and_ttl_removes_finished_jobs(cli: Cli, cluster: Cluster) -> None:
    kept = cli.gcluster(*submit_args("kept-job", "echo kept", "--await-job-completion"))
    assert kept.code == 0, kept.text
    listed = cli.gcluster("job", "list", "--status", "Succeeded")
    lines = listed.out.splitlines()
    assert lines[0].endswith(f"Listing jobs in cluster '{cluster.name}'...")
    header, row = lines[1], lines[2]
    assert header.startswith("NAME       STATUS      CREATION_TIME          COMPLETION_TIME")
    assert row.startswith("kept-job   Succeeded   20")
    short = cli.gcluster(
        *submit_args("short-ttl", "echo bye", "--await-job-completion", "--gke-ttl-after-finished", "1h"),
        env={"TPU_RL_SANDBOX_TTL_SCALE": "0.0001"},
    )
    assert short.code == 0, short.text
    wait_for(lambda: "short-ttl" not in cli.gcluster("job", "list").out, what="TTL garbage collection")
    assert "kept-job" in cli.gcluster("job", "list").out
    gone = cli.gcluster("job", "logs", "short-ttl")
    assert (gone.code, gone.err) == (1, "Error: jobset short-ttl not found in any namespace\n")
    bad_status = cli.gcluster("job", "list", "--status", "Done")
    assert bad_status.code == 1
    assert "invalid value for --status: Done" in bad_status.err


def test_train_fails_without_a_converted_checkpoint(cli: Cli, cluster: Cluster) -> None:
    result = cli.gcluster(
        *submit_args(
            "rl-no-ckpt",
            train_command(cluster, steps=2, period=2),
            *pathways_flags(cluster),
            "--await-job-completion",
        )
    )
    assert result.code == 1
    assert "Error: job completed unsuccessfully with status: Failed" in result.err
    assert f"Checkpoint at gs://{cluster.bucket}/qwen/max-text-format/0/items not found." in logs(
        cli, "rl-no-ckpt"
    )
    assert cli.objects(cluster.bucket, "qwen/trained/") == []


def test_resume_from_a_complete_final_checkpoint_finishes_at_once(cli: Cli, cluster: Cluster) -> None:
    convert(cli, cluster)
    command = train_command(cluster, steps=2, period=2, tests=0)
    assert (
        cli.gcluster(*submit_args("rl-a", command, *pathways_flags(cluster), "--await-job-completion")).code
        == 0
    )
    assert (
        cli.gcluster(*submit_args("rl-b", command, *pathways_flags(cluster), "--await-job-completion")).code
        == 0
    )
    text = logs(cli, "rl-b")
    assert "Restored params from step: 2 in" in text
    assert "Train step" not in text
    assert "Pre RL Training" not in text  # num_test_batches=0 prints no reward lines
    assert "RL Training Completed Successfully!" in text


def test_token_must_come_from_an_existing_secret(cli: Cli, cluster: Cluster) -> None:
    inline = CONVERT.format(token="export HF_TOKEN=x", bucket=cluster.bucket) + " hf_access_token=hf_abc"
    result = cli.gcluster(*submit_args("token-inline", inline, "--await-job-completion", "--restarts", "0"))
    assert result.code == 1
    assert "hf_access_token= was passed on the command line" in logs(cli, "token-inline")
    nope = f"projects/{cluster.project}/secrets/nope/versions/latest"
    # The renderer's form: the failed read stops the && chain before MaxText starts.
    missing_secret = CONVERT.format(token=hf_token_from_secret_manager(nope), bucket=cluster.bucket)
    result = cli.gcluster(
        *submit_args("token-missing", missing_secret, "--await-job-completion", "--restarts", "0")
    )
    assert result.code == 1
    text = logs(cli, "token-missing")
    assert (
        "requests.exceptions.HTTPError: 404 Client Error: Not Found for url: "
        f"https://secretmanager.googleapis.com/v1/{nope}:access"
    ) in text
    assert "Loading Hugging Face model" not in text
    # `export VAR="$(...)"` hides the failure: MaxText starts with an empty token and fails.
    masked = CONVERT.format(token=f'export HF_TOKEN="$({read_secret_python(nope)})"', bucket=cluster.bucket)
    result = cli.gcluster(*submit_args("token-masked", masked, "--await-job-completion", "--restarts", "0"))
    assert result.code == 1
    text = logs(cli, "token-masked")
    assert "404 Client Error" in text
    assert "GatedRepoError: 401" in text


def test_writes_need_a_storage_role_for_the_node_pool_account(cli: Cli, names: dict[str, str]) -> None:
    project, cluster_name, bucket = names["project"], names["cluster"], names["bucket"]
    assert cli.gcloud("storage", "buckets", "create", f"gs://{bucket}", f"--project={project}").code == 0
    from tests.sandbox.conftest import deploy_args

    assert cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names)).code == 0
    assert cli.gcloud("auth", "configure-docker", "gcr.io,us-east5-docker.pkg.dev").code == 0
    assert (
        cli.gcloud("secrets", "create", "hf", f"--project={project}", "--data-file=-", stdin=b"v").code == 0
    )
    reader = f"serviceAccount:{cluster_name}-gke-np-sa@{project}.iam.gserviceaccount.com"
    granted = cli.gcloud(
        "secrets",
        "add-iam-policy-binding",
        "hf",
        f"--project={project}",
        f"--member={reader}",
        "--role=roles/secretmanager.secretAccessor",
    )
    assert granted.code == 0, granted.text  # the token is readable: only the write is refused
    token = hf_token_from_secret_manager(f"projects/{project}/secrets/hf/versions/latest")
    command = CONVERT.format(token=token, bucket=bucket)
    result = cli.gcluster(
        *submit_args(
            "no-role", command, "--await-job-completion", "-p", project, "-c", cluster_name, "-l", "us-east5"
        )
    )
    assert result.code == 1
    text = cli.gcluster(
        "job", "logs", "no-role", "--main-only", "-p", project, "-c", cluster_name, "-l", "us-east5"
    ).err
    assert (
        f"{cluster_name}-gke-np-sa@{project}.iam.gserviceaccount.com does not have storage.objects.create access"
        in text
    )


def _exited(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return True


def test_cancel_kills_the_worker_and_deletes_the_jobset(cli: Cli, cluster: Cluster, tmp_path: Path) -> None:
    convert(cli, cluster)
    hold = tmp_path / "hold"
    hold.touch()
    submitted = cli.gcluster(
        *submit_args("cancel-me", train_command(cluster, steps=4, period=2), *pathways_flags(cluster)),
        env={"TPU_RL_SANDBOX_HOLD_FILE": str(hold)},
    )
    assert submitted.code == 0
    wait_for(lambda: job_status(cli, cluster, "cancel-me") == "Running", what="job to start")
    job = cli.job(cluster.project, cluster.region, cluster.name, "cancel-me")
    assert job is not None
    cancelled = cli.gcluster("job", "cancel", "cancel-me")
    assert cancelled.code == 0, cancelled.text
    assert "Canceling job 'cancel-me'" in cancelled.out
    assert "Cancel operation on Job 'cancel-me' completed successfully." in cancelled.out
    assert job_status(cli, cluster, "cancel-me") is None
    wait_for(lambda: _exited(int(job["pid"])), what="worker to stop")
    unknown = cli.gcluster("job", "cancel", "cancel-me")
    assert (unknown.code, unknown.err) == (1, "Error: jobset cancel-me not found in any namespace\n")


def test_logs_follow_streams_until_the_job_ends(cli: Cli, cluster: Cluster, tmp_path: Path) -> None:
    convert(cli, cluster)
    hold = tmp_path / "hold"
    hold.touch()
    env = {"TPU_RL_SANDBOX_HOLD_FILE": str(hold)}
    assert (
        cli.gcluster(
            *submit_args(
                "follow-me", train_command(cluster, steps=2, period=2, tests=0), *pathways_flags(cluster)
            ),
            env=env,
        ).code
        == 0
    )
    wait_for(lambda: job_status(cli, cluster, "follow-me") == "Running", what="job to start")
    followed: list[str] = []
    thread = threading.Thread(
        target=lambda: followed.append(cli.gcluster("job", "logs", "follow-me", "-f", "--main-only").out)
    )
    thread.start()
    hold.unlink()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert "Streaming logs for job 'follow-me'..." in followed[0]
    assert followed[0].rstrip().endswith("RL Training Completed Successfully!")
    assert "Starting RL training..." in followed[0]
