"""A real one-node Slurm (Debian's slurmctld, slurmd and munge) on 127.0.0.1, for tests that submit to it.

Its state, logs and munge key and socket live in one folder. The config is /etc/slurm/slurm.conf, where
real clusters keep it: the Slurm executor plugin clears SLURM_* variables (SLURM_CONF too) inside jobs, so
their `srun` finds only the standard path. An existing foreign file there is never overwritten. Nodes and
controller are addressed as 127.0.0.1 only. The daemons are this process's children, stopped (after every
job is cancelled) and the config removed when the context ends, also on failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from eaglepipe.processes import die_with_parent

PACKAGES = ["slurmd", "slurmctld", "slurm-client", "munge"]
PROGRAMS = ["munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo"]


def install_slurm() -> None:
    """apt-get install Slurm and munge when a program is missing; services are never started by apt."""
    if all(shutil.which(program) for program in PROGRAMS):
        return
    policy = Path("/usr/sbin/policy-rc.d")  # Debian's switch that keeps postinst from starting daemons
    added_policy = not policy.exists()
    if added_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update"], check=True, capture_output=True, env=env, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES],
            check=True,
            capture_output=True,
            env=env,
            timeout=900,
        )
    finally:
        if added_policy:
            policy.unlink()


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def node_memory_mb() -> int:
    """Most of the machine's memory: slurmd drains a node that claims more than it has."""
    total_kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
    return int(total_kb / 1024 * 0.8)


SLURM_CONF = Path("/etc/slurm/slurm.conf")
GRES_CONF = SLURM_CONF.with_name("gres.conf")
MARKER = "# Written by eaglepipe's tests (tests/slurm_cluster.py); removed when they stop.\n"
# GPUs the node declares to Slurm without devices behind them: enough for the scheduler to accept, count
# and allocate `--gpus=MODEL:N` as the executor plugin writes it; jobs still compute on the CPU.
GPU_MODEL, GPUS = "tiny", 4


def slurm_conf(folder: Path, host: str, cpus: int, memory_mb: int, munge_socket: Path) -> str:
    return (
        MARKER
        + f"""\
ClusterName=eaglepipe
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_loopback_port()}
SlurmdPort={free_loopback_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
GresTypes=gpu
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 NodeHostname={host} CPUs={cpus} RealMemory={memory_mb} \\
 Gres=gpu:{GPU_MODEL}:{GPUS} State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    )


class Slurm:
    """Clients of the running cluster: their environment and a few commands."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env

    def command(self, *args: str, timeout: int = 60) -> str:
        run = subprocess.run(args, capture_output=True, text=True, env=self.env, timeout=timeout)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {run.stderr.strip()}")
        return run.stdout

    def jobs(self) -> list[dict[str, str]]:
        """Queued and running jobs as {id, name, state}."""
        out = self.command("squeue", "--noheader", "--format=%i|%j|%T|%k")
        return [
            dict(zip(("id", "name", "state", "comment"), line.split("|"), strict=True))
            for line in out.splitlines()
            if line.strip()
        ]

    def job_fields(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as {field: value}; finished jobs stay listed for an hour (MinJobAge)."""
        out = self.command("scontrol", "show", "job", "--oneliner", job_id)
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def log_tail(self) -> str:
        return "".join(
            f"--- {name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-20:]) + "\n"
            for name in ("slurmctld.log", "slurmd.log", "munged.log")
            if (path := self.folder / name).is_file()
        )


def _wait_for(condition, what: str, timeout: float, slurm: Slurm | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"Slurm: {what} within {timeout:.0f} s\n" + (slurm.log_tail() if slurm else "")
            )
        time.sleep(0.5)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _node_idle(slurm: Slurm) -> bool:
    try:
        return slurm.command("sinfo", "--noheader", "--format=%t").strip() == "idle"
    except RuntimeError:
        return False


@contextmanager
def running_slurm(folder: Path) -> Iterator[Slurm]:
    """munged, slurmctld and slurmd started in `folder`; yields once the node is idle."""
    install_slurm()
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    for sub in ("state", "spool", "munge"):
        (folder / sub).mkdir(exist_ok=True)
    key = folder / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = folder / "munge" / "munge.socket"
    host = socket.gethostname().split(".")[0]
    for conf in (SLURM_CONF, GRES_CONF):
        if conf.exists() and not conf.read_text().startswith(MARKER):
            raise RuntimeError(f"{conf} exists and is not a test cluster's: not starting one over it")
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    slurm = Slurm(folder, env)
    with ExitStack() as stack:
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SLURM_CONF.write_text(slurm_conf(folder, host, os.cpu_count() or 1, node_memory_mb(), munge_socket))
        stack.callback(SLURM_CONF.unlink, missing_ok=True)
        for index in range(GPUS):  # Slurm counts a GPU per device file: copies of /dev/null stand in
            device = folder / f"gpu{index}"
            device.unlink(missing_ok=True)
            os.mknod(device, stat.S_IFCHR | 0o600, os.stat("/dev/null").st_rdev)
        devices = f"{folder}/gpu[0-{GPUS - 1}]"
        GRES_CONF.write_text(MARKER + f"NodeName={host} Name=gpu Type={GPU_MODEL} File={devices}\n")
        stack.callback(GRES_CONF.unlink, missing_ok=True)

        def start(*command: str) -> None:
            log = stack.enter_context(open(folder / f"{Path(command[0]).name}.out", "w"))
            # Killed with this process even when it cannot clean up (SIGKILL, a CI timeout).
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent
            )
            stack.callback(_stop, process)

        # Started in this order, stopped in the reverse one (ExitStack), after every job is cancelled.
        start(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={munge_socket}",
            f"--pid-file={folder}/munge/munged.pid",
            f"--seed-file={folder}/munge/munged.seed",
            f"--log-file={folder}/munged.log",
        )
        _wait_for(munge_socket.exists, "munged did not open its socket", 30)
        start("slurmctld", "-D", "-i")
        start("slurmd", "-D", "-N", host)
        stack.callback(_cancel_all, slurm)
        _wait_for(lambda: _node_idle(slurm), "the node did not become idle", 60, slurm)
        yield slurm


def _cancel_all(slurm: Slurm) -> None:
    """Cancel every job and wait until the queue is empty, so no job outlives the daemons."""
    try:
        slurm.command("scancel", "--full", "--user", "root")
        _wait_for(lambda: not slurm.jobs(), "jobs were still queued after scancel", 60, slurm)
    except RuntimeError:
        pass  # the daemons stop next whatever the queue says
