"""The reader's network (torch): a BERT encoder reading a (question, sentence) pair, the mean of
its token states, one logit. `PairModel.from_base` builds it for training (the base frozen,
low-rank adapters on `reader_adapter.TARGETS`, layer norms and head trainable); `PairModel.merged`
builds it for serving, the adapters added into the base weights. Imported only where torch is
wanted (reader.py loads it in `warm_up()`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer

from retrieval.sentences.reader_adapter import TARGETS, ReaderMeta, merge_adapters

logger = logging.getLogger(__name__)


class LoraLinear(nn.Module):
    """`base(x) + scale * x A^T B^T`; B starts at zero, so training starts from the base."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.empty(rank, base.in_features))
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + (x @ self.a.t() @ self.b.t()) * self.scale
        return out


def add_adapters(encoder: Any, rank: int, alpha: float, first_layer: int = 0) -> None:
    """Freeze `encoder`, put trainable adapters on `TARGETS` of each layer from `first_layer` on
    and make their layer norms trainable (and the embeddings' where `first_layer` is 0). Below
    `first_layer` nothing needs a gradient, so autograd keeps no graph there: training costs
    a forward pass through the frozen layers."""
    for parameter in encoder.parameters():
        parameter.requires_grad = False
    trained = list(encoder.encoder.layer)[first_layer:]
    for layer in trained:
        for target in TARGETS:
            parent_name, _, attr = target.rpartition(".")
            parent = layer.get_submodule(parent_name)
            setattr(parent, attr, LoraLinear(getattr(parent, attr), rank, alpha))
    roots = [*trained, encoder.embeddings] if first_layer == 0 else trained
    for root in roots:
        for module in root.modules():
            if isinstance(module, nn.LayerNorm):
                for parameter in module.parameters():
                    parameter.requires_grad = True


def encoder_arrays(encoder: Any) -> dict[str, npt.NDArray[np.float32]]:
    """An adapted encoder's adapters and layer norms, by the adapter file's names."""
    out: dict[str, npt.NDArray[np.float32]] = {}
    for name, module in encoder.named_modules():
        if isinstance(module, LoraLinear):
            out[f"lora/{name}/a"] = module.a.detach().float().cpu().numpy()
            out[f"lora/{name}/b"] = module.b.detach().float().cpu().numpy()
        elif isinstance(module, nn.LayerNorm):
            out[f"norm/{name}/weight"] = module.weight.detach().float().cpu().numpy()
            out[f"norm/{name}/bias"] = module.bias.detach().float().cpu().numpy()
    return out


class PairModel(nn.Module):
    def __init__(self, encoder: Any) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(encoder.config.hidden_size, 1)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        logits: torch.Tensor = self.head(self.dropout(pooled)).squeeze(-1)
        return logits

    @classmethod
    def from_base(cls, base_dir: str, rank: int, alpha: float) -> tuple[PairModel, Any]:
        encoder = AutoModel.from_pretrained(base_dir, dtype=torch.float32)
        add_adapters(encoder, rank, alpha)
        return cls(encoder), AutoTokenizer.from_pretrained(base_dir)

    def load_adapter(self, arrays: dict[str, npt.NDArray[Any]]) -> None:
        """Start from a trained adapter of the same rank (`adapter_arrays`' names): its
        adapters, layer norms and head copied in, to be trained further."""
        modules = dict(self.encoder.named_modules())
        with torch.no_grad():
            for key, value in arrays.items():
                kind, _, rest = key.partition("/")
                tensor = torch.from_numpy(np.asarray(value, np.float32))
                if kind == "head":
                    getattr(self.head, rest).copy_(tensor)
                    continue
                name, _, part = rest.rpartition("/")
                getattr(modules[name], part).copy_(tensor)

    def adapter_arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        """What ships: the adapters, the layer norms and the head."""
        out = encoder_arrays(self.encoder)
        out["head/weight"] = self.head.weight.detach().float().cpu().numpy()
        out["head/bias"] = self.head.bias.detach().float().cpu().numpy()
        return out

    @classmethod
    def merged(
        cls, base_dir: str, meta: ReaderMeta, arrays: dict[str, npt.NDArray[Any]]
    ) -> tuple[PairModel, Any]:
        """The serving model: each adapter added into its base weight (W + scale B A)."""
        encoder = AutoModel.from_pretrained(base_dir, dtype=torch.float32)
        used = merge_adapters(encoder, meta.alpha / meta.rank, arrays)
        with torch.no_grad():
            model = cls(encoder)
            model.head.weight.copy_(torch.from_numpy(np.asarray(arrays["head/weight"], np.float32)))
            model.head.bias.copy_(torch.from_numpy(np.asarray(arrays["head/bias"], np.float32)))
            used |= {"head/weight", "head/bias"}
        unknown = set(arrays) - used
        if unknown:
            raise ValueError(f"the adapter has arrays this model does not: {sorted(unknown)[:3]}")
        return model, AutoTokenizer.from_pretrained(base_dir)


def train_steps(
    model: nn.Module,
    loss_at: Callable[[int], torch.Tensor],
    steps: int,
    *,
    learning_rate: float,
    checkpoint: Path,
    warmup_share: float = 0.1,
    clip: float | None = None,
    checkpoint_every: int = 100,
    log_every: int = 20,
) -> tuple[list[float], float]:
    """AdamW over `model`'s trainable parameters for `steps` steps of `loss_at(step)`, the
    learning rate warming up over `warmup_share` of them, then falling linearly to zero; the
    losses and the seconds spent training, over every sitting of a resumed run. Every `checkpoint_every` steps and at the end, the trainable weights, optimizer,
    schedule and losses are saved to `checkpoint` (written aside, then renamed); a run that
    finds one resumes from its step. `loss_at` must give a step's batch as a function of the
    step alone (a seeded order), so that a resumed run sees what the killed one would have."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=learning_rate, weight_decay=0.01)
    warmup = max(1, int(steps * warmup_share))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))),
    )
    step, losses, before_s = 0, [], 0.0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["scheduler"])
        step, losses = int(state["step"]), list(state["losses"])
        before_s = float(state.get("seconds", 0.0))
        logger.info("training resumed step=%d steps=%d", step, steps)
    began = time.monotonic()
    model.train()
    while step < steps:
        loss = loss_at(step)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        schedule.step()
        step += 1
        losses.append(float(loss.detach()))
        if step % log_every == 0:
            logger.info(
                "training step=%d steps=%d loss=%.4f elapsed_s=%.0f",
                step,
                steps,
                float(np.mean(losses[-log_every:])),
                time.monotonic() - began,
            )
        if step % checkpoint_every == 0 or step == steps:
            state = {
                "model": {n: t for n, t in model.state_dict().items() if n in trainable},
                "optimizer": optimizer.state_dict(),
                "scheduler": schedule.state_dict(),
                "step": step,
                "losses": losses,
                "seconds": before_s + time.monotonic() - began,
            }
            aside = checkpoint.with_suffix(".tmp")
            torch.save(state, aside)
            aside.replace(checkpoint)
    model.eval()
    return losses, before_s + time.monotonic() - began
