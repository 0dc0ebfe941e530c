"""Training the drafter with EAGLE-3's training-time test (TTT), then exporting it.

Alignment (docs/drafter.md): the target's state at position t produced token t+1. Draft row t consumes
(aux[t], token t+1) and learns the target's distribution at t+1, i.e. predicts token t+2. Unroll step i
feeds the row its own previous next_h with token t+1+i and learns the target's distribution at t+1+i.
A row counts at step i when tokens t+1 .. t+2+i are all completion tokens (a chain inside one answer,
as at serving time) and the target's top token at t+1+i is in the draft vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import Tensor

from eaglepipe.config import section_fields
from eaglepipe.config_types import DrafterSection
from eaglepipe.drafter import DrafterError
from eaglepipe.drafter.checkpoint import (
    load_checkpoint,
    remove_checkpoint,
    save_checkpoint,
    training_fingerprint,
)
from eaglepipe.drafter.data import SampleRef, TrainingSample, load_samples, open_hidden_data
from eaglepipe.drafter.export import export_drafter
from eaglepipe.drafter.frozen import load_target_embeddings
from eaglepipe.drafter.model import DraftCache, Eagle3Config, Eagle3Drafter
from eaglepipe.drafter.vocab import build_draft_vocab
from eaglepipe.hidden.shards import StateCodec
from eaglepipe.io import file_sha256, write_json
from eaglepipe.progress import StepProgress
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.layer_ids import check_engines_agree

STEP_WEIGHT = 0.8  # loss weight of unroll step i is STEP_WEIGHT ** i
LOSS_CURVE_POINTS = 20

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """The `drafter` section of the config, less what cannot change the drafter (gpus, export_speculators);
    schemas/config.schema.yaml holds the defaults."""

    draft_vocab_size: int  # capped at the target vocabulary
    ttt_length: int
    lr: float
    epochs: int
    max_steps: int | None
    batch_tokens: int  # padded tokens per batch
    max_seq_len: int  # longer samples are cut
    warmup_ratio: float
    grad_clip: float = 0.5  # not a config key
    seed: int
    dtype: str  # "bfloat16" on GPU: autocast over float32 master weights
    device: str
    checkpoint_every: int  # steps between checkpoints (0: none)
    batches_per_step: int  # per rank: gradients accumulated over this many batches per optimizer step
    set_weights: dict[str, float]  # by set name; others 1.0
    curve_points: int  # drafters kept along training for the learning curve (the final one included)

    @classmethod
    def from_section(cls, section: DrafterSection) -> TrainSettings:
        """From the validated config's `drafter` section (the keys the rule passes; others are ignored)."""
        return cls(**section_fields(cls, section))

    def __post_init__(self) -> None:
        positive = (
            "draft_vocab_size", "ttt_length", "epochs", "batch_tokens", "max_seq_len", "batches_per_step"
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise DrafterError(f"training setting {name} is {getattr(self, name)}: it must be at least 1")
        if any(weight < 0 for weight in self.set_weights.values()):
            raise DrafterError(f"config key drafter.set_weights {self.set_weights}: weights must be >= 0")
        if self.curve_points < 0:
            raise DrafterError(f"training setting curve_points is {self.curve_points}: use 0 or more")
        if self.checkpoint_every < 0:
            raise DrafterError(f"training setting checkpoint_every is {self.checkpoint_every}: use 0 or more")
        if self.max_steps is not None and self.max_steps < 1:
            raise DrafterError(f"training setting max_steps is {self.max_steps}: use null or at least 1")
        if not (self.lr > 0 and 0 <= self.warmup_ratio < 1 and self.grad_clip > 0):
            raise DrafterError("training settings need lr > 0, 0 <= warmup_ratio < 1 and grad_clip > 0")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise DrafterError(f"training setting dtype {self.dtype!r}: use float32, bfloat16 or float16")


class LossPoint(TypedDict):
    step: int
    loss: float


class ManifestRef(TypedDict):
    manifest: str
    sha256: str


class TrainReport(TypedDict):
    """train.json (docs/formats.md); the figures read it. `settings` is `TrainSettings` as asdict makes it."""

    steps: int
    epochs: float
    data_parallel_ranks: int
    tokens_seen: int
    tokens_per_second: float
    loss_curve: list[LossPoint]
    ttt_accuracy: list[float | None]
    ttt_accuracy_window_steps: int
    train_samples: int
    train_samples_by_set: dict[str, int]
    train_tokens: int
    held_out_prompt_ids: list[str]
    held_out_with_hidden_states: int
    data: list[ManifestRef]
    resumed_from_step: int | None
    draft_vocab_size: int
    aux_layer_ids: list[int]
    settings: dict[str, Any]
    seconds: float


@dataclass
class Batch:
    aux: Tensor  # [B, L, 3H] float32
    final: Tensor  # [B, L, H] float32
    input_ids: Tensor  # [B, L]
    loss_mask: Tensor  # [B, L] bool, False on padding
    num_tokens: int
    key: int | None = None  # the same samples always get the same key (the batch's index)


def train_drafter(
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
    """Train on every sample not held out and export to `out_dir`; return the report (train.json). With a
    `checkpoint_dir` and `settings.checkpoint_every`, a killed training resumes from its latest checkpoint.
    `set_names` name the manifests' prompt sets, for `settings.set_weights`. With `settings.curve_points`,
    the drafters along the way go to `snapshot_dir` (see `Snapshots`)."""
    started = time.perf_counter()
    data = open_hidden_data(manifests, holdout_ids=holdout_ids)
    if not data.samples:
        raise DrafterError(
            f"no training samples in {[str(m) for m in manifests]} after holding out "
            f"{len(data.held_out)}: generate more or hold out fewer"
        )
    target = TargetArchitecture.from_dir(target_dir)
    config = Eagle3Config.from_target(target, settings.draft_vocab_size, data.aux_layer_ids, settings.dtype)
    check_engines_agree(config.aux_layer_ids)  # before training, not after
    if data.hidden_size != config.target_hidden_size:
        raise DrafterError(
            f"hidden states have width {data.hidden_size}, the target {target_dir} has "
            f"{config.target_hidden_size}: extract them with this target"
        )
    device = torch.device(settings.device)
    torch.manual_seed(settings.seed)
    embed, lm_head = load_target_embeddings(target_dir)
    drafter = Eagle3Drafter(config, embed.float())
    drafter.set_draft_vocab(*build_draft_vocab(data.token_counts, config.draft_vocab_size, config.vocab_size))
    drafter.to(device).train()
    draft_ids = torch.arange(config.draft_vocab_size, device=device)
    teacher = Teacher(lm_head.to(device, torch.float32), drafter.draft_to_target(draft_ids))

    names = list(set_names) if set_names is not None else [str(m) for m in manifests]
    unknown = sorted(set(settings.set_weights) - set(names))
    if unknown:
        raise DrafterError(f"config key drafter.set_weights names {unknown}, not sets of this run ({names})")
    mixed = mix_sets(data.samples, [settings.set_weights.get(name, 1.0) for name in names], settings.seed)
    if not mixed:
        raise DrafterError(f"drafter.set_weights {settings.set_weights} leave no training sample: raise one")
    batches = make_batches(mixed, settings.batch_tokens, settings.max_seq_len)
    manifest_shas = [file_sha256(Path(m)) for m in manifests]
    shaping = {**dataclasses.asdict(settings), "data_parallel_ranks": DataParallel.current().size}
    fingerprint = training_fingerprint(manifest_shas, holdout_ids, target.config, shaping)
    checkpoints = Checkpoints(checkpoint_dir, settings.checkpoint_every, fingerprint)
    snapshots = Snapshots(snapshot_dir, checkpoint_dir, settings.curve_points, fingerprint)
    fit_started = time.perf_counter()
    progress = _fit(drafter, teacher, batches, data.codec, settings, checkpoints, snapshots)
    fit_seconds = time.perf_counter() - fit_started
    ranks = DataParallel.current()
    if ranks.rank == 0:  # every rank holds the same weights
        export_drafter(drafter.cpu(), out_dir)
        snapshots.publish(len(progress.losses), progress.tokens_seen)
        remove_checkpoint(checkpoint_dir)
    correct, counted = (torch.stack(column).sum(0) for column in zip(*progress.window, strict=True))
    losses = progress.losses
    report: TrainReport = {
        "steps": len(losses),
        "epochs": round(len(losses) * ranks.size * settings.batches_per_step / len(batches), 3),
        "data_parallel_ranks": ranks.size,
        "tokens_seen": progress.tokens_seen,
        "tokens_per_second": round(progress.tokens_seen / fit_seconds, 1),
        "loss_curve": [{"step": s + 1, "loss": round(losses[s], 4)} for s in _curve_points(len(losses))],
        "ttt_accuracy": [
            round(c / n, 4) if n else None for c, n in zip(correct.tolist(), counted.tolist(), strict=True)
        ],
        "ttt_accuracy_window_steps": len(progress.window),
        "train_samples": len(data.samples),
        "train_samples_by_set": {name: sum(ref.source == i for ref in mixed) for i, name in enumerate(names)},
        "train_tokens": sum(ref.num_tokens for ref in data.samples),
        "held_out_prompt_ids": sorted(holdout_ids),
        "held_out_with_hidden_states": len(data.held_out),
        "data": [
            {"manifest": str(m), "sha256": sha}
            for m, sha in zip(manifests, manifest_shas, strict=True)
        ],
        "resumed_from_step": progress.resumed_from_step,
        "draft_vocab_size": config.draft_vocab_size,
        "aux_layer_ids": list(config.aux_layer_ids),
        "settings": dataclasses.asdict(settings),
        "seconds": round(time.perf_counter() - started, 1),
    }
    return report


@dataclass
class Progress:
    losses: list[float]
    window: deque[tuple[Tensor, Tensor]]  # (correct, counted) per step, over the last epoch's worth of steps
    tokens_seen: int = 0
    resumed_from_step: int | None = None


@dataclass
class Checkpoints:
    directory: Path | None
    every: int
    fingerprint: str

    def due(self, step: int, total_steps: int) -> bool:
        return self.directory is not None and self.every > 0 and step % self.every == 0 and step < total_steps


@dataclass
class Snapshots:
    """The drafter exported at `points` evenly spaced steps (the last is the final drafter), for the
    learning curve. Staged beside the checkpoint, which survives a killed job (Snakemake empties a job's
    declared outputs before it starts), and moved to `directory` with `index.json` once training ends."""

    directory: Path | None
    checkpoint_dir: Path | None
    points: int
    fingerprint: str

    @property
    def staging(self) -> Path | None:
        if self.directory is None:
            return None
        return self.checkpoint_dir / "snapshots" if self.checkpoint_dir is not None else self.directory

    def steps(self, total_steps: int) -> list[int]:
        """Steps after which a snapshot is taken, the last step excluded (the final drafter is that one)."""
        if self.directory is None or self.points < 2:
            return []
        steps = {max(1, round(total_steps * k / self.points)) for k in range(1, self.points)}
        return sorted(steps - {total_steps})

    def discard_stale(self) -> None:
        """A training that does not resume starts the curve over."""
        if self.staging is not None and self.staging != self.directory:
            shutil.rmtree(self.staging, ignore_errors=True)

    def take(self, drafter: Eagle3Drafter, step: int, tokens_seen: int) -> None:
        staging = self.staging
        assert staging is not None  # `steps` lists none without a directory
        folder = staging / f"step-{step:07d}"
        export_drafter(drafter, folder)
        record = {"step": step, "tokens_seen": tokens_seen, "fingerprint": self.fingerprint}
        write_json(folder / "snapshot.json", record)

    def publish(self, final_step: int, final_tokens_seen: int) -> None:
        """index.json lists this training's snapshots in step order; the final drafter is the last point."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        points = []
        if self.staging is not None and self.staging.is_dir():
            for folder in sorted(self.staging.glob("step-*")):
                record = json.loads((folder / "snapshot.json").read_text())
                if record["fingerprint"] != self.fingerprint:
                    continue
                if self.staging != self.directory:
                    shutil.rmtree(self.directory / folder.name, ignore_errors=True)
                    shutil.move(str(folder), self.directory / folder.name)
                points.append(
                    {"step": record["step"], "tokens_seen": record["tokens_seen"], "dir": folder.name}
                )
            if self.staging != self.directory:
                shutil.rmtree(self.staging, ignore_errors=True)
        points.append({"step": final_step, "tokens_seen": final_tokens_seen, "dir": None})
        write_json(self.directory / "index.json", {"points": points if self.points else []})


def _fit(
    drafter: Eagle3Drafter,
    teacher: Teacher,
    batches: list[list[SampleRef]],
    codec: StateCodec,
    settings: TrainSettings,
    checkpoints: Checkpoints,
    snapshots: Snapshots,
) -> Progress:
    """The optimisation loop. A step takes `ranks x batches_per_step` batches of the seeded epoch order;
    each rank runs its share and the gradients are averaged over ranks by one all-reduce, so N ranks train
    exactly as one process with `batches_per_step` N would (up to float summation order)."""
    ranks = DataParallel.current()
    per_step = ranks.size * settings.batches_per_step
    steps_per_epoch = len(batches) // per_step
    if steps_per_epoch < 1:
        raise DrafterError(
            f"{len(batches)} batches cannot fill one step of {ranks.size} GPU(s) x drafter.batches_per_step "
            f"{settings.batches_per_step}: lower drafter.batch_tokens or the GPUs, or train on more data"
        )
    total_steps = steps_per_epoch * settings.epochs
    if settings.max_steps is not None:
        total_steps = min(total_steps, settings.max_steps)
    device = torch.device(settings.device)
    parameters = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    schedule = warmup_cosine(total_steps, settings.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    order = torch.Generator().manual_seed(settings.seed)
    autocast = torch.autocast(
        device.type, dtype=getattr(torch, settings.dtype), enabled=settings.dtype != "float32"
    )
    progress = Progress(losses=[], window=deque(maxlen=steps_per_epoch))
    epoch_order: list[int] = []
    position = 0  # batches of epoch_order already trained on
    saved = load_checkpoint(checkpoints.directory, checkpoints.fingerprint)
    if saved is not None:
        drafter.load_state_dict(saved["drafter"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        order.set_state(saved["order_generator"])
        torch.set_rng_state(saved["torch_rng"])
        epoch_order, position = saved["epoch_order"], saved["position"]
        progress.losses, progress.tokens_seen = saved["losses"], saved["tokens_seen"]
        progress.window.extend(saved["window"])
        progress.resumed_from_step = saved["step"]
    elif ranks.rank == 0:
        snapshots.discard_stale()
    snapshot_steps = set(snapshots.steps(total_steps))
    shown = StepProgress(log, "training", total_steps - len(progress.losses), unit="steps")
    while len(progress.losses) < total_steps:
        if position + per_step > len(epoch_order):  # a new epoch; the few batches left over wait for the next
            epoch_order, position = torch.randperm(len(batches), generator=order).tolist(), 0
        mine = epoch_order[position : position + per_step][ranks.rank :: ranks.size]
        position += per_step
        optimizer.zero_grad(set_to_none=True)
        loss_sum, tokens = 0.0, 0
        correct = counted = torch.zeros(settings.ttt_length, dtype=torch.long)
        for index in mine:
            batch = collate(load_samples(batches[index], codec), device, key=index)
            with autocast:
                loss, batch_correct, batch_counted = ttt_loss(drafter, teacher, batch, settings.ttt_length)
            (loss / len(mine)).backward()
            loss_sum, tokens = loss_sum + loss.item(), tokens + batch.num_tokens
            correct, counted = correct + batch_correct, counted + batch_counted
        loss_mean, tokens, correct, counted = ranks.average_gradients(
            parameters, loss_sum / len(mine), tokens, correct, counted
        )
        torch.nn.utils.clip_grad_norm_(parameters, settings.grad_clip)
        optimizer.step()
        scheduler.step()
        progress.losses.append(loss_mean)
        progress.window.append((correct, counted))
        progress.tokens_seen += tokens
        shown.advance(1, tokens)
        step = len(progress.losses)
        if step in snapshot_steps and ranks.rank == 0:
            snapshots.take(drafter, step, progress.tokens_seen)
        if checkpoints.directory is not None and checkpoints.due(step, total_steps) and ranks.rank == 0:
            save_checkpoint(checkpoints.directory, {
                "fingerprint": checkpoints.fingerprint,
                "step": step,
                "drafter": drafter.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "order_generator": order.get_state(),
                "torch_rng": torch.get_rng_state(),
                "epoch_order": epoch_order,
                "position": position,
                "losses": progress.losses,
                "tokens_seen": progress.tokens_seen,
                "window": list(progress.window),
            })
    return progress


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the data-parallel ranks (torchrun), or a single process."""

    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> DataParallel:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    def average_gradients(
        self, parameters: list[torch.nn.Parameter], loss: float, tokens: int, correct: Tensor, counted: Tensor
    ) -> tuple[float, int, Tensor, Tensor]:
        """Average the gradients over ranks in one all-reduce (what DDP does, without overlapping it with
        the backward pass); sum the step's figures. Returns (mean loss, tokens, correct, counted)."""
        if self.size == 1:
            return loss, tokens, correct, counted
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.flatten() for g in grads])
        figures = torch.cat([torch.tensor([loss, float(tokens)]), correct.double(), counted.double()])
        flat = torch.cat([flat.double(), figures.to(flat.device)])
        dist.all_reduce(flat)
        offset = 0
        for parameter, grad in zip(parameters, grads, strict=True):
            parameter.grad = (flat[offset : offset + grad.numel()] / self.size).view_as(grad).to(grad.dtype)
            offset += grad.numel()
        figures = flat[offset:].cpu()
        n = len(correct)
        return (float(figures[0]) / self.size, int(figures[1]), figures[2 : 2 + n].long(),
                figures[2 + n :].long())


class Teacher:
    """The frozen target lm_head split into draft-vocabulary rows and the rest.

    The draft rows give the target distribution restricted to the draft vocabulary; the rest only has to
    say whether the target's top token falls outside it, so no full-vocabulary softmax is ever formed.
    That answer is kept per batch key: later epochs skip the larger half of the product.
    """

    def __init__(self, lm_head: Tensor, draft_target_ids: Tensor) -> None:
        """`draft_target_ids[i]`: the target id of draft id i."""
        outside = torch.ones(len(lm_head), dtype=torch.bool, device=lm_head.device)
        outside[draft_target_ids] = False
        self.draft_rows = lm_head[draft_target_ids]
        self.other_rows = lm_head[outside]
        self.in_draft_by_key: dict[int, Tensor] = {}

    @torch.no_grad()
    def targets(self, final: Tensor, loss_mask: Tensor, key: int | None = None) -> tuple[Tensor, Tensor]:
        """(probs [N, draft vocab], row [B, L]: index into probs, -1 where position p is not a target).

        Position p is a target when tokens p and p+1 are completion tokens and the target's top token
        at p is in the draft vocabulary.
        """
        supervised = loss_mask & shift_left(loss_mask, 1, False)
        states = final[supervised].float()
        draft_logits = states @ self.draft_rows.T
        in_draft = self.in_draft_by_key.get(key) if key is not None else None
        if in_draft is None:
            in_draft = self._top_token_in_draft(states, draft_logits)
            if key is not None:
                self.in_draft_by_key[key] = in_draft
        row = torch.full(loss_mask.shape, -1, dtype=torch.long, device=loss_mask.device)
        positions = supervised.nonzero()[in_draft]
        row[positions[:, 0], positions[:, 1]] = torch.arange(len(positions), device=row.device)
        return draft_logits[in_draft].softmax(-1), row

    def _top_token_in_draft(self, states: Tensor, draft_logits: Tensor) -> Tensor:
        if not len(self.other_rows):
            return torch.ones(len(states), dtype=torch.bool, device=states.device)
        other_best = torch.cat([(chunk @ self.other_rows.T).amax(-1) for chunk in states.split(1024)])
        return draft_logits.amax(-1) > other_best


def ttt_loss(
    drafter: Eagle3Drafter, teacher: Teacher, batch: Batch, ttt_length: int
) -> tuple[Tensor, Tensor, Tensor]:
    """(weighted loss, correct top-1 per step, counted rows per step) of one unrolled batch."""
    probs, target_row = teacher.targets(batch.final, batch.loss_mask, batch.key)
    chain_ok = shift_left(batch.loss_mask, 1, False)  # the chain starts on a completion token
    cache = DraftCache()
    hidden = batch.aux
    loss = batch.aux.new_zeros(())
    correct, counted = [], []
    for step in range(ttt_length):
        chain_ok = chain_ok & shift_left(batch.loss_mask, 2 + step, False)
        hidden = drafter.step(shift_left(batch.input_ids, 1 + step, 0), hidden, cache)
        rows = shift_left(target_row, 1 + step, -1)
        counts = chain_ok & (rows >= 0)
        logits = drafter.logits(hidden[counts]).float()
        loss = loss + STEP_WEIGHT**step * SoftCrossEntropy.apply(logits, probs, rows[counts])
        correct.append((logits.argmax(-1) == probs[rows[counts]].argmax(-1)).sum())
        counted.append(counts.sum())
    return loss, torch.stack(correct).cpu(), torch.stack(counted).cpu()


class SoftCrossEntropy(torch.autograd.Function):
    """Mean over rows of -sum(p * log_softmax(logits)), with p = probs[rows].

    Backward keeps only the logits: the plain expression would also keep the log-softmax and a gathered
    copy of p for every unroll step, which at a 32k draft vocabulary is most of the training memory.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, probs: Tensor, rows: Tensor) -> Tensor:
        ctx.save_for_backward(logits, probs, rows)
        return -(probs[rows] * logits.log_softmax(-1)).sum() / max(len(rows), 1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        logits, probs, rows = ctx.saved_tensors
        return (logits.softmax(-1) - probs[rows]) * (grad / max(len(rows), 1)), None, None


def mix_sets(samples: list[SampleRef], weights: list[float], seed: int) -> list[SampleRef]:
    """Each set's samples `int(w)` times, plus a seeded share `w - int(w)` of them once more: weight 2
    shows a set twice per epoch, 0.5 half of it (the same half every epoch), 0 leaves it out."""
    generator = torch.Generator().manual_seed(seed)
    mixed: list[SampleRef] = []
    for source, weight in enumerate(weights):
        own = [ref for ref in samples if ref.source == source]
        mixed += own * int(weight)
        extra = round((weight - int(weight)) * len(own))
        if extra:
            chosen = torch.randperm(len(own), generator=generator)[:extra].sort().values.tolist()
            mixed += [own[i] for i in chosen]
    return mixed


def make_batches(samples: list[SampleRef], batch_tokens: int, max_seq_len: int) -> list[list[SampleRef]]:
    """Samples of similar length together, so padding stays small; each batch pads to <= batch_tokens."""
    cut = sorted(
        (dataclasses.replace(s, stop=min(s.stop, s.start + max_seq_len)) for s in samples),
        key=lambda s: (-s.num_tokens, s.prompt_id),
    )
    batches: list[list[SampleRef]] = []
    for sample in cut:  # longest first, so the first sample of a batch sets its padded length
        if batches and (len(batches[-1]) + 1) * batches[-1][0].num_tokens <= batch_tokens:
            batches[-1].append(sample)
        else:
            batches.append([sample])
    return batches


def collate(samples: list[TrainingSample], device: torch.device, key: int | None = None) -> Batch:
    length = max(len(s.input_ids) for s in samples)
    first = samples[0]
    aux = torch.zeros(len(samples), length, first.aux.shape[-1])
    final = torch.zeros(len(samples), length, first.final.shape[-1])
    input_ids = torch.zeros(len(samples), length, dtype=torch.long)
    loss_mask = torch.zeros(len(samples), length, dtype=torch.bool)
    for i, sample in enumerate(samples):
        n = len(sample.input_ids)
        aux[i, :n], final[i, :n] = sample.aux, sample.final
        input_ids[i, :n], loss_mask[i, :n] = sample.input_ids, sample.loss_mask
    return Batch(
        aux.to(device),
        final.to(device),
        input_ids.to(device),
        loss_mask.to(device),
        sum(len(s.input_ids) for s in samples),
        key,
    )


def shift_left(x: Tensor, by: int, fill: float | int | bool) -> Tensor:
    """x[:, t + by] at column t, `fill` past the end."""
    out = torch.full_like(x, fill)
    if by < x.shape[1]:
        out[:, : x.shape[1] - by] = x[:, by:]
    return out


def warmup_cosine(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    """LambdaLR factor: linear warm-up to the full rate, then cosine decay to zero at the last step."""
    warmup = math.ceil(total_steps * warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total_steps - warmup)))

    return factor


def _curve_points(num_steps: int) -> list[int]:
    if num_steps <= LOSS_CURVE_POINTS:
        return list(range(num_steps))
    return sorted({round(i * (num_steps - 1) / (LOSS_CURVE_POINTS - 1)) for i in range(LOSS_CURVE_POINTS)})
