"""The sentence reader on the real packaged MiniLM: an adapter written after training is read
back and merged into the encoder so that the serving model scores as the trained one did, and
the shipped adapter prefers the sentence that answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval.embedder import DEFAULT_EMBEDDER, resolve_model_path
from retrieval.errors import RetrievalError
from retrieval.sentences.reader import (
    ReaderConfig,
    ReaderMeta,
    SentenceReader,
    pair_text,
    write_adapter,
)

pytestmark = pytest.mark.integration

QUESTION = "Who designed the bridge over the river?"
SENTENCES = [
    ("The bridge was designed by the engineer Anna Berg in 1932.", "Old Bridge"),
    ("The bridge is 300 metres long and carries two lanes.", "Old Bridge"),
    ("The river floods most springs.", "Old Bridge"),
]


def _pairs(tokenizer: Any, meta: ReaderMeta) -> Any:
    """QUESTION against each of SENTENCES, tokenized as the reader reads them."""
    return tokenizer(
        [QUESTION] * len(SENTENCES),
        [pair_text(text, title, meta.with_title) for text, title in SENTENCES],
        truncation="longest_first",
        max_length=meta.max_tokens,
        padding=True,
        return_tensors="pt",
    )


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_a_written_adapter_merges_into_the_encoder_and_scores_as_trained(
    tmp_path: Path, runtime: str
) -> None:
    """Under torch the adapters are merged into the weights; under ONNX Runtime the merged
    encoder is exported (float32 here) and pooled and scored in numpy."""
    import torch

    from retrieval.sentences.reader_model import PairModel

    torch.manual_seed(0)
    meta = ReaderMeta(rank=4, alpha=8.0, max_tokens=64, with_title=True)
    model, tokenizer = PairModel.from_base(resolve_model_path(DEFAULT_EMBEDDER), 4, 8.0)
    with torch.no_grad():  # as if trained: adapters, a norm and the head away from the start
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(0.05 * torch.randn_like(parameter))
    model.eval()
    encoded = _pairs(tokenizer, meta)
    with torch.inference_mode():
        trained = model(**encoded).numpy()
    path = tmp_path / "reader.npz"
    write_adapter(path, meta, model.adapter_arrays())
    assert path.stat().st_size < 2_000_000

    config = ReaderConfig(
        adapter=path, device="cpu", dtype="float32", runtime=runtime, cache_dir=tmp_path
    )
    served = SentenceReader(config).scores(QUESTION, SENTENCES)
    # The adapter is stored in float16: the same scores to a few thousandths, the same order.
    assert np.allclose(served, trained, atol=0.05)
    assert list(np.argsort(served)) == list(np.argsort(trained))


@pytest.mark.parametrize("runtime", ["torch", "onnx"])
def test_the_shipped_reader_prefers_the_sentence_that_answers(runtime: str) -> None:
    """As it serves: torch in float32, or ONNX Runtime in int8 (the CPU's default)."""
    reader = SentenceReader(ReaderConfig(device="cpu", runtime=runtime))
    scores = reader.scores(QUESTION, SENTENCES)
    assert int(np.argmax(scores)) == 0
    when = reader.scores(
        "When did the museum open?",
        [
            ("The museum's collection holds two million objects.", "Museum"),
            ("The museum opened to the public in 1857.", "Museum"),
        ],
    )
    assert int(np.argmax(when)) == 1


def test_a_reader_for_another_embedder_is_refused_with_what_to_do() -> None:
    reader = SentenceReader(ReaderConfig(device="cpu"), embedder_model="some/other-model")
    with pytest.raises(RetrievalError, match=r"eval\.calibrate\.sentence_reader"):
        reader.warm_up()


def test_an_adapter_loaded_for_further_training_scores_as_the_served_one() -> None:
    import torch

    from retrieval.sentences.reader import read_adapter
    from retrieval.sentences.reader_model import PairModel

    meta, arrays = read_adapter()
    model, tokenizer = PairModel.from_base(
        resolve_model_path(DEFAULT_EMBEDDER), meta.rank, meta.alpha
    )
    encoded = _pairs(tokenizer, meta)
    model.eval()
    with torch.inference_mode():
        fresh = model(**encoded).numpy()
    model.load_adapter(arrays)
    with torch.inference_mode():
        loaded = model(**encoded).numpy()
    config = ReaderConfig(device="cpu", dtype="float32", runtime="torch")
    served = SentenceReader(config).scores(QUESTION, SENTENCES)
    np.testing.assert_allclose(loaded, served, atol=1e-3)
    assert not np.allclose(fresh, served, atol=1e-2)


def test_training_killed_midway_resumes_to_the_weights_of_a_run_never_stopped(
    tmp_path: Path,
) -> None:
    """`train_steps` (the reader's and the span head's loop) saves its checkpoint and a run that
    finds one carries on from its step: the weights come out as those of one unbroken run."""
    import torch

    from retrieval.sentences.reader_model import train_steps

    data = torch.randn(10, 4, generator=torch.Generator().manual_seed(1))

    def run(checkpoint: Path, kill_at: int | None) -> torch.Tensor:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)

        def loss_at(step: int) -> torch.Tensor:
            if step == kill_at:
                raise KeyboardInterrupt
            return model(data[step : step + 1]).pow(2).sum()

        train_steps(
            model, loss_at, 10, learning_rate=0.1, checkpoint=checkpoint, checkpoint_every=3
        )
        return model.weight.detach().clone()

    unbroken = run(tmp_path / "a.pt", None)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "b.pt", 7)
    killed = torch.load(tmp_path / "b.pt", weights_only=False)
    assert killed["step"] == 6
    assert killed["seconds"] > 0
    resumed = run(tmp_path / "b.pt", None)
    assert torch.allclose(resumed, unbroken)
    torch.manual_seed(0)
    assert not torch.allclose(unbroken, torch.nn.Linear(4, 1).weight.detach())
