"""The span head's network (torch): a BERT encoder reading (question, sentence) and one linear
layer giving each token a start and an end logit (span.py reads it; this imports nothing of
span.py, so the two do not import each other). `SpanModel.from_base` builds it for training
(reader_model.py's adapters and trainable layer norms); `SpanModel.merged` builds it for serving,
the adapters added into the base weights. Imported only where torch is wanted (span.py loads it
in `warm_up()`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn
from transformers import AutoModel, AutoTokenizer

from retrieval.sentences.reader_adapter import merge_adapters
from retrieval.sentences.reader_model import add_adapters, encoder_arrays


class SpanModel(nn.Module):
    def __init__(self, encoder: Any) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(encoder.config.hidden_size, 2)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(start logits, end logits), each batch x tokens."""
        hidden = self.encoder(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state
        logits = self.head(self.dropout(hidden))
        return logits[..., 0], logits[..., 1]

    @classmethod
    def from_base(
        cls, base_dir: str, rank: int, alpha: float, first_layer: int = 0
    ) -> tuple[SpanModel, Any]:
        """For training: adapters on the frozen base from `first_layer` on (rank 0: the base
        frozen, only the head learns)."""
        encoder = AutoModel.from_pretrained(base_dir, dtype=torch.float32)
        if rank > 0:
            add_adapters(encoder, rank, alpha, first_layer)
        else:
            for parameter in encoder.parameters():
                parameter.requires_grad = False
        return cls(encoder), AutoTokenizer.from_pretrained(base_dir)

    def encoder_load(self, arrays: dict[str, npt.NDArray[Any]]) -> None:
        """Start the trained adapters and layer norms from another adapter file's of the same
        rank (the sentence reader's: it has learned to read a question against a sentence);
        its arrays for frozen layers and its head are left out."""
        modules = dict(self.encoder.named_modules())
        with torch.no_grad():
            for key, value in arrays.items():
                name, _, part = key.partition("/")[2].rpartition("/")
                target = getattr(modules.get(name), part, None)
                if isinstance(target, nn.Parameter) and target.requires_grad:
                    target.copy_(torch.from_numpy(np.asarray(value, np.float32)))

    def arrays(self) -> dict[str, npt.NDArray[np.float32]]:
        """What ships: the adapters, the layer norms and the head."""
        out = encoder_arrays(self.encoder)
        out["head/weight"] = self.head.weight.detach().float().cpu().numpy()
        out["head/bias"] = self.head.bias.detach().float().cpu().numpy()
        return out

    @classmethod
    def merged(
        cls, base_dir: str, scale: float, arrays: dict[str, npt.NDArray[Any]]
    ) -> tuple[SpanModel, Any]:
        """The serving model: each adapter added into its base weight (`scale`: the
        adapters' alpha / rank)."""
        encoder = AutoModel.from_pretrained(base_dir, dtype=torch.float32)
        used = merge_adapters(encoder, scale, arrays)
        model = cls(encoder)
        with torch.no_grad():
            model.head.weight.copy_(torch.from_numpy(np.asarray(arrays["head/weight"], np.float32)))
            model.head.bias.copy_(torch.from_numpy(np.asarray(arrays["head/bias"], np.float32)))
        unknown = set(arrays) - used - {"head/weight", "head/bias"}
        if unknown:
            raise ValueError(f"the span head has arrays this model does not: {sorted(unknown)[:3]}")
        return model, AutoTokenizer.from_pretrained(base_dir)
