"""Data-parallel training over the GPUs a job was given: `torchrun` starts one process per GPU, each
trains on its share of every step's batches (`train._fit`), and rank 0 exports the drafter and writes the
report. One GPU, or the CPU, trains in the job's own process.

    python -m torch.distributed.run --standalone --nproc-per-node N -m eaglepipe.drafter.distributed JOB.json
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from eaglepipe.drafter import DrafterError
from eaglepipe.drafter.train import TrainReport, TrainSettings, train_drafter

log = logging.getLogger(__name__)


def train_data_parallel(
    processes: int,
    manifests: list[Path],
    target_dir: Path,
    out_dir: Path,
    *,
    holdout_ids: set[str],
    settings: TrainSettings,
    checkpoint_dir: Path | None = None,
    set_names: list[str] | None = None,
    snapshot_dir: Path | None = None,
) -> TrainReport:
    """`train_drafter` over `processes` ranks (GPUs when `settings.device` is cuda, else CPU processes
    talking over gloo); the report of rank 0. With one process, trains here."""
    if processes <= 1:
        return train_drafter(
            manifests,
            target_dir,
            out_dir,
            holdout_ids=holdout_ids,
            settings=settings,
            checkpoint_dir=checkpoint_dir,
            set_names=set_names,
            snapshot_dir=snapshot_dir,
        )
    with tempfile.TemporaryDirectory(prefix="eaglepipe-train-") as scratch:
        job = Path(scratch) / "job.json"
        report = Path(scratch) / "report.json"
        job.write_text(
            json.dumps(
                {
                    "manifests": [str(m) for m in manifests],
                    "target_dir": str(target_dir),
                    "out_dir": str(out_dir),
                    "holdout_ids": sorted(holdout_ids),
                    "settings": dataclasses.asdict(settings),
                    "checkpoint_dir": str(checkpoint_dir) if checkpoint_dir else None,
                    "set_names": set_names,
                    "snapshot_dir": str(snapshot_dir) if snapshot_dir else None,
                    "report": str(report),
                }
            )
        )
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={processes}",
            "-m",
            "eaglepipe.drafter.distributed",
            str(job),
        ]
        log.info("training on %d ranks: %s", processes, " ".join(command))
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as ranks:
            assert ranks.stdout is not None
            for line in ranks.stdout:  # the ranks' logs, into this job's log
                log.info("%s", line.rstrip())
        if ranks.returncode != 0 or not report.is_file():
            raise DrafterError(
                f"data-parallel training failed (torchrun status {ranks.returncode}): see the job log"
            )
        return json.loads(report.read_text())


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rank %(process)d %(name)s: %(message)s")
    job = json.loads(Path(sys.argv[1]).read_text())
    settings = TrainSettings(**job["settings"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if settings.device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        settings = dataclasses.replace(settings, device=f"cuda:{local_rank}")
        dist.init_process_group("nccl")
    else:
        torch.set_num_threads(1)  # CPU ranks share the job's cores
        dist.init_process_group("gloo")
    try:
        report = train_drafter(
            [Path(m) for m in job["manifests"]],
            Path(job["target_dir"]),
            Path(job["out_dir"]),
            holdout_ids=set(job["holdout_ids"]),
            settings=settings,
            checkpoint_dir=Path(job["checkpoint_dir"]) if job["checkpoint_dir"] else None,
            set_names=job["set_names"],
            snapshot_dir=Path(job["snapshot_dir"]) if job["snapshot_dir"] else None,
        )
        if dist.get_rank() == 0:
            Path(job["report"]).write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
