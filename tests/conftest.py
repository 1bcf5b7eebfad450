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


# Gemma's (and early Mistral's) kind: no system role, user and model turns alternating.
NO_SYSTEM_ROLE = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def tokenizer_with_template(target: Path, chat_template: str) -> Path:
    """A real tokenizer (the packaged MiniLM's) given `chat_template`: fast, no SGLang env."""
    source = Path(resolve_model_path(DEFAULT_EMBEDDER))
    target.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(source / name, target / name)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config["chat_template"] = chat_template
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


@pytest.fixture(scope="session")
def chatml_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tokenizer_with_template(tmp_path_factory.mktemp("chatml-tokenizer"), CHATML)


@pytest.fixture(scope="session")
def no_system_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chat template that refuses a system message (Gemma's)."""
    return tokenizer_with_template(tmp_path_factory.mktemp("gemma-tokenizer"), NO_SYSTEM_ROLE)
