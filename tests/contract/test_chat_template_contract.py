"""The `ChatTemplate` contract (generation/prompt_layout.py), for SmolLM2's real template, a
real tokenizer given ChatML, and the fake."""

from __future__ import annotations

from pathlib import Path

import pytest

from generation.prompt_layout import ChatMessage, ChatTemplate, HFChatTemplate
from tests.fakes.word_template import WordTemplate

MESSAGES = [
    ChatMessage("system", "You answer from the passages."),
    ChatMessage("user", "Passages: tea is steeped. Question: how long?"),
]


@pytest.fixture(scope="module", params=["smollm2", "chatml_minilm", "words"])
def template(
    request: pytest.FixtureRequest, smollm2_dir: Path, chatml_tokenizer_dir: Path
) -> ChatTemplate:
    made: ChatTemplate
    if request.param == "smollm2":
        made = HFChatTemplate(str(smollm2_dir))
    elif request.param == "chatml_minilm":
        made = HFChatTemplate(str(chatml_tokenizer_dir))
    else:
        made = WordTemplate()
    made.warm_up()
    return made


def test_render_holds_every_message_in_order(template: ChatTemplate) -> None:
    text = template.render(MESSAGES)
    system = text.index(MESSAGES[0].content)
    user = text.index(MESSAGES[1].content)
    assert system < user


def test_the_same_messages_render_byte_identical(template: ChatTemplate) -> None:
    """Prefix reuse rests on this: the same system prompt and passages give the same bytes."""
    assert template.render(MESSAGES) == template.render(list(MESSAGES))


def test_longer_text_counts_more_tokens(template: ChatTemplate) -> None:
    short = template.count_tokens("green tea")
    longer = template.count_tokens("green tea is steeped for two minutes at eighty degrees")
    assert 0 < short < longer


def test_the_vocabulary_of_a_text_holds_the_vocabulary_of_its_words(template: ChatTemplate) -> None:
    """The copy bias raises what `vocabulary` returns: every token a passage is made of, so a
    longer passage has more and the words of a shorter one are all among them."""
    short = template.vocabulary(["green tea"])
    longer = template.vocabulary(["green tea is steeped for two minutes"])
    assert short < longer
    assert template.vocabulary([]) <= short


def test_the_vocabulary_holds_a_word_inside_a_sentence_and_opening_one(smollm2_dir: Path) -> None:
    """ " Germany" and "Germany" are two tokens: an answer may open with the word a passage has
    mid-sentence. The end of the answer is in too, so a biased answer still ends."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_dir))
    template = HFChatTemplate(str(smollm2_dir))
    vocabulary = template.vocabulary(["The cabinet came from Germany."])
    for form in (" Germany", "Germany"):
        (token,) = tokenizer(form, add_special_tokens=False)["input_ids"]
        assert token in vocabulary
    assert tokenizer.eos_token_id in vocabulary
    assert tokenizer(" France", add_special_tokens=False)["input_ids"][0] not in vocabulary
