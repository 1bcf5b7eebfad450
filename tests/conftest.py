from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from retrieval.embedder import DEFAULT_EMBEDDER, resolve_model_path

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="session")
def chatml_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tokenizer (the packaged MiniLM's) given a ChatML template: fast, no SGLang env."""
    source = Path(resolve_model_path(DEFAULT_EMBEDDER))
    target = tmp_path_factory.mktemp("chatml-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = CHATML
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target
