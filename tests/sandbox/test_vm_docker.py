"""The TPU VM's Docker (runtime container): Ubuntu's docker.io from apt, root only, registry
credentials before a pull, only images the sandbox's registry holds, TPU chips only in a
privileged container, and training in it reads and writes GCS as the VM does."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf
from tests.sandbox import test_vm
from tests.sandbox.conftest import Cli
from tests.sandbox.test_vm import create_vm, grant_vm_account, ssh
from tpu_rl_sandbox.world.settings import load_settings, update_settings

# test_vm's fixtures: a bucket and the "hf" secret in a fresh project, apt free after boot
prepared = test_vm.prepared
boot_apt_seconds = test_vm.boot_apt_seconds

IMAGE = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"
MODEL = "llama3.1-8b-Instruct"


def _pipeline(names: dict[str, str], vm: str):
    return tpu_vm_pipeline_from_conf(
        {
            "project": names["project"],
            "zone": names["zone"],
            "vm_name": vm,
            "reservation": "res-8",
            "bucket": names["bucket"],
            "hf_token_secret": "hf",
            "num_batches": 2,
            "train_overrides": {"num_test_batches": 1},
        },
        run_id="manual__docker",
    )


def _vm(cli: Cli, names: dict[str, str]) -> str:
    vm = f"dk-{names['cluster']}"
    create_vm(cli, names, vm, "--scopes=cloud-platform")
    grant_vm_account(cli, names, vm)
    return vm


def _convert_in_container(cli: Cli, names: dict[str, str], vm: str, output: str) -> None:
    """A converted checkpoint in GCS, written by the image's own converter (no venv on this VM)."""
    convert = shlex.join(
        ["sudo", "--preserve-env=HF_TOKEN", "docker", "run", "--rm", "--net=host", "-e", "HF_TOKEN", IMAGE,
         "python3", "-m",
         "maxtext.checkpoint_conversion.to_maxtext", f"model_name={MODEL}", f"base_output_directory={output}",
         "scan_layers=True", "use_multimodal=False", "hardware=cpu", "skip_jax_distributed_system=true",
         "checkpoint_storage_use_zarr3=1", "checkpoint_storage_use_ocdbt=1", "--lazy_load_tensors=False"]
    )  # fmt: skip
    script = f"set -euo pipefail\nHF_TOKEN=$(gcloud secrets versions access latest --secret=hf) {convert}\n"
    code, out, err = ssh(cli, names, vm, script)
    assert code == 0, out + err


def test_docker_pull_needs_docker_root_credentials_and_a_known_image(
    cli: Cli, prepared: dict[str, str]
) -> None:
    names = prepared
    vm = _vm(cli, names)
    code, _, _ = ssh(cli, names, vm, "command -v docker\n")
    assert code == 1  # the sandbox's accelerator image has no Docker: the script installs docker.io
    code, out, err = ssh(cli, names, vm, "sudo apt-get install -y docker.io && command -v docker\n")
    assert code == 0, err
    assert out.strip().endswith("/docker")
    code, _, err = ssh(cli, names, vm, f"docker pull {IMAGE}\n")
    assert code == 1
    assert "permission denied while trying to connect to the Docker daemon socket" in err
    code, _, err = ssh(cli, names, vm, f"sudo docker pull {IMAGE}\n")
    assert code == 1
    assert "denied: Unauthenticated request" in err
    assert '"projects/cloud-tpu-images/locations/us/repositories/maxtext-images"' in err
    # the login user's credential helper is not root's: sudo's docker reads /root/.docker
    code, _, err = ssh(
        cli, names, vm, f"gcloud auth configure-docker us-docker.pkg.dev --quiet\nsudo docker pull {IMAGE}\n"
    )
    assert code == 1
    assert "denied: Unauthenticated request" in err
    code, out, err = ssh(
        cli,
        names,
        vm,
        f"sudo gcloud auth configure-docker us-docker.pkg.dev --quiet\nsudo docker pull {IMAGE}\n",
    )
    assert code == 0, err
    assert "Adding credentials for: us-docker.pkg.dev" in err
    assert f"Status: Downloaded newer image for {IMAGE}" in out
    code, out, _ = ssh(cli, names, vm, f"sudo docker pull {IMAGE}\n")
    assert code == 0
    assert f"Status: Image is up to date for {IMAGE}" in out
    unknown = IMAGE.replace(":0.2.4", ":0.2.5")
    code, _, err = ssh(cli, names, vm, f"sudo docker pull {unknown}\n")
    assert code == 1
    assert f"manifest for {unknown} not found: manifest unknown" in err


def test_the_rendered_container_runtime_trains_only_in_a_privileged_container(
    cli: Cli, prepared: dict[str, str]
) -> None:
    """The rendered install and train scripts on a TPU VM: the container trains from and to GCS
    with the VM's chips; the same run without --privileged has no TPU (JAX's own failure); the
    token is on no argv the VM saw; the VM's history records the container runtime."""
    names = prepared
    vm = _vm(cli, names)
    pipeline = _pipeline(names, vm)
    code, out, err = ssh(cli, names, vm, tpu_vm.container_install_script(pipeline))
    assert code == 0, out + err
    assert f"Status: Downloaded newer image for {IMAGE}" in out
    _convert_in_container(cli, names, vm, pipeline.conversion.output_directory)

    train = tpu_vm.container_train_script(pipeline)
    unprivileged = train.replace(" --privileged", "")
    code, out, err = ssh(cli, names, vm, unprivileged)
    assert code != 0
    assert "Unable to initialize backend 'tpu'" in err

    code, out, err = ssh(cli, names, vm, train)
    assert code == 0, out + err
    assert "Post RL Training: corr=" in out
    run = f"{MODEL}/post-train/{pipeline.training.run_name}/checkpoints/actor/2/model_params/_METADATA"
    assert run in cli.objects(names["bucket"], f"{MODEL}/post-train/")
    assert "hf_vm" not in out + err  # the token's value is never printed
    # nothing is left of the containers (--rm), and the VM's own home has no venv
    vm_dir = cli.layout.vm_dir(vm)
    assert not any((vm_dir / ".containers").iterdir())
    assert not list(vm_dir.glob("home/*/maxtext_venv"))
    (life,) = cli.state("vm_history")[f"{names['project']}/{names['zone']}/{vm}"]
    assert [(p["module"], p["runtime"]) for p in life["programs"]] == [
        ("maxtext.checkpoint_conversion.to_maxtext", "container"),
        ("maxtext.trainers.post_train.rl.train_rl", "container"),
        ("maxtext.trainers.post_train.rl.train_rl", "container"),
    ]


def test_docker_run_passes_only_the_named_environment(cli: Cli, prepared: dict[str, str]) -> None:
    """``-e NAME`` copies the client's value (sudo keeps it only with --preserve-env); nothing
    else of the VM's environment reaches the container."""
    names = prepared
    vm = _vm(cli, names)
    pipeline = _pipeline(names, vm)
    code, out, err = ssh(cli, names, vm, tpu_vm.container_install_script(pipeline))
    assert code == 0, out + err
    show = (
        'python3 -c \'import os; print(sorted(k for k in os.environ if k.startswith(("SECRET", "KEPT"))))\''
    )
    script = (
        "export KEPT=1 SECRET=2\n"
        f"sudo docker run --rm {IMAGE} {show}\n"
        f"sudo docker run --rm -e KEPT -e SECRET {IMAGE} {show}\n"
        f"sudo --preserve-env=KEPT docker run --rm -e KEPT -e SECRET {IMAGE} {show}\n"
    )
    code, out, err = ssh(cli, names, vm, script)
    assert code == 0, out + err
    assert out.splitlines()[-3:] == ["[]", "[]", "['KEPT']"]
    code, _, err = ssh(cli, names, vm, f"sudo docker run --rm --gpus=all {IMAGE} true\n")
    assert code == 125
    assert "unknown flag: --gpus" in err


def test_without_roots_credential_helper_the_pull_logs_in_with_a_token_and_logs_out(
    cli: Cli, prepared: dict[str, str]
) -> None:
    """A VM whose gcloud is not Debian's package has no docker-credential-gcloud on sudo's PATH:
    the helper configure-docker registers breaks every pull (as the tutorials' one line does), and
    the rendered pull logs root in with the VM account's token instead, for the pull alone."""
    names = prepared
    before = load_settings(cli.layout).vm_docker_credential_helper
    update_settings(cli.layout, vm_docker_credential_helper=False)
    try:
        vm = _vm(cli, names)
        install = "sudo apt-get install -y docker.io\n"
        code, _, err = ssh(
            cli,
            names,
            vm,
            f"{install}sudo gcloud auth configure-docker us-docker.pkg.dev --quiet\nsudo docker pull {IMAGE}\n",
        )
        assert code == 1
        assert "WARNING: `docker-credential-gcloud` not in system PATH." in err
        assert (
            'error getting credentials - err: exec: "docker-credential-gcloud": executable file not found'
            in err
        )
        # an earlier try's helper entry would keep failing a login too: start from a clean config
        assert ssh(cli, names, vm, "sudo rm -f /root/.docker/config.json\n")[0] == 0
        script = "set -euo pipefail\n" + "\n".join(tpu_vm.registry_pull_lines(IMAGE)) + "\n"
        code, out, err = ssh(cli, names, vm, script)
        assert code == 0, out + err
        assert "docker-credential-gcloud is not on root PATH: logging in to us-docker.pkg.dev" in err
        assert "Login Succeeded" in out
        assert f"Status: Downloaded newer image for {IMAGE}" in out
        assert "Removing login credentials for us-docker.pkg.dev" in out
        code, out, _ = ssh(cli, names, vm, "sudo cat /root/.docker/config.json\n")
        assert code == 0
        assert "ya29." not in out  # no token left on the disk
        assert "us-docker.pkg.dev" not in out
    finally:
        update_settings(cli.layout, vm_docker_credential_helper=before)


def test_with_roots_credential_helper_the_pull_uses_it(cli: Cli, prepared: dict[str, str]) -> None:
    names = prepared
    vm = _vm(cli, names)
    script = (
        "set -euo pipefail\nsudo apt-get install -y docker.io\n"
        + "\n".join(tpu_vm.registry_pull_lines(IMAGE))
        + "\n"
    )
    code, out, err = ssh(cli, names, vm, script)
    assert code == 0, out + err
    assert "Adding credentials for: us-docker.pkg.dev" in err
    assert "Login Succeeded" not in out


def test_a_containers_labels_state_logs_and_exit_status_as_docker_gives_them(
    cli: Cli, prepared: dict[str, str]
) -> None:
    """``docker run --label``/``-l``, ``docker inspect --format`` of the state and the labels,
    ``docker logs --follow`` from the container's start until it stops (stdout and stderr apart)
    and ``docker wait`` (its exit status; gone with a ``--rm`` container that ended). A client that
    follows or waits is another session's: the container is the daemon's."""
    names = prepared
    vm = _vm(cli, names)
    pipeline = _pipeline(names, vm)
    code, out, err = ssh(cli, names, vm, tpu_vm.container_install_script(pipeline))
    assert code == 0, out + err
    program = "echo first; echo oops >&2; sleep 2; echo last; exit 7"
    form = (
        '{{.State.Running}} {{.State.Status}} {{index .Config.Labels "io.tpu-rl.run-id"}}|'
        '{{index .Config.Labels "bare"}}|{{index .Config.Labels "absent"}}|'
    )
    script = "\n".join(
        [
            f"sudo docker run --name=kept --label=io.tpu-rl.run-id=dag/run-1 -l bare {IMAGE} "
            f"bash -c {shlex.quote(program)} >/dev/null 2>&1 &",
            "until sudo docker inspect --format '{{.Id}}' kept >/dev/null 2>&1; do sleep 0.1; done",
            f"sudo docker inspect --format {shlex.quote(form)} kept",
            "sudo docker logs --follow kept >followed.out 2>followed.err &",
            "sudo docker wait kept",
            "wait",
            'echo "out: $(tr "\\n" " " <followed.out)"',
            'echo "err: $(tr "\\n" " " <followed.err)"',
            f"sudo docker inspect --format {shlex.quote(form)} kept",
            "sudo docker wait kept",  # stopped: at once
            "sudo docker rm kept",
            "",
        ]
    )
    code, out, err = ssh(cli, names, vm, script)
    assert code == 0, out + err
    assert out.splitlines()[-7:] == [
        "true running dag/run-1|||",
        "7",
        "out: first last ",
        "err: oops ",
        "false exited dag/run-1|||",
        "7",
        "kept",
    ]
    started = "until sudo docker inspect --format '{{.Id}}' gone >/dev/null 2>&1; do sleep 0.1; done"
    script = "\n".join(
        [
            f"sudo docker run --rm --name=gone {IMAGE} bash -c 'sleep 1; exit 3' >/dev/null 2>&1 &",
            started,
            "sudo docker wait gone",  # asked while it runs: its status
            "wait",
            "sudo docker wait gone || echo wait-failed",  # --rm: gone once it ended
            "sudo docker logs --follow gone || echo logs-failed",
            "",
        ]
    )
    code, out, err = ssh(cli, names, vm, script)
    assert code == 0, out + err
    assert out.splitlines()[-3:] == ["3", "wait-failed", "logs-failed"]
    assert err.count("Error response from daemon: No such container: gone") == 2


def test_docker_refuses_what_it_does_not_take(cli: Cli, prepared: dict[str, str]) -> None:
    names = prepared
    vm = _vm(cli, names)
    pipeline = _pipeline(names, vm)
    code, out, err = ssh(cli, names, vm, tpu_vm.container_install_script(pipeline))
    assert code == 0, out + err
    code, _, err = ssh(cli, names, vm, f"sudo docker run --rm -l =x {IMAGE} true\n")
    assert code == 125
    assert "invalid label '=x': empty name" in err
    code, _, err = ssh(cli, names, vm, "sudo docker wait\n")
    assert code == 1
    assert '"docker wait" requires at least 1 argument.' in err
    code, _, err = ssh(cli, names, vm, "sudo docker logs a b\n")
    assert code == 1
    assert '"docker logs" requires exactly 1 argument.' in err
    code, _, err = ssh(cli, names, vm, "sudo docker logs --bogus a\n")
    assert code == 125
    assert "unknown flag: --bogus" in err
    code, _, err = ssh(cli, names, vm, "docker wait a\n")
    assert code == 1
    assert "permission denied while trying to connect to the Docker daemon socket" in err


def test_a_removed_containers_record_never_signals_the_process_that_took_its_pid(tmp_path: Path) -> None:
    """The same for the VMs' docker daemon: ``docker rm --force`` (and a machine's stop) signals a
    container's process only while its argv names the container's id."""
    import subprocess
    import sys

    from tpu_rl_sandbox.machines import dockerd

    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        out, err = tmp_path / "c.out", tmp_path / "c.err"
        record = {"id": "a" * 64, "name": "tpu-rl-train", "pid": stranger.pid, "exit": None,
                  "out": str(out), "err": str(err)}  # fmt: skip
        assert not dockerd.running(record)
        with dockerd.locked(tmp_path) as found:
            found["tpu-rl-train"] = record
        assert dockerd.stop(tmp_path, "tpu-rl-train")
        time.sleep(0.2)
        assert stranger.poll() is None, "a process that is not the container's was signalled"
        assert "tpu-rl-train" not in dockerd.containers(tmp_path)
    finally:
        stranger.kill()
        stranger.wait(timeout=30)
