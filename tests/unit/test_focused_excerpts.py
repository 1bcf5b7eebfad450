"""The focused form's context (answer_service/pipeline/forms.py `focused_excerpts`): the best
sentences with their neighbours, one excerpt per passage, and a definition's sentences after
the term they define."""

from __future__ import annotations

from answer_service.pipeline.forms import focused_excerpts
from tests.builders import scored_page

SETTINGS = """checkpoint_timeout (integer)

 Maximum time between automatic WAL checkpoints. The valid range is between 30 seconds and
 one day. The default is five minutes (5min). Increasing it lengthens crash recovery.

checkpoint_completion_target (floating point)

 Specifies the target of checkpoint completion. The default is 0.9.
"""


def test_a_definitions_sentence_comes_after_its_term() -> None:
    """The model reads "The default is five minutes" knowing which setting it is said of."""
    found = scored_page(SETTINGS, {"The default is five": 0.9, "Increasing it": 0.5})
    (excerpt,) = focused_excerpts(found, groups=1, neighbours=1)
    assert excerpt.text.startswith(
        "checkpoint_timeout (integer): The valid range is between 30 seconds and\n one day. "
        "The default is five minutes (5min). Increasing it lengthens crash recovery."
    )


def test_a_term_already_in_the_excerpt_is_not_said_twice() -> None:
    found = scored_page(SETTINGS, {"Maximum time between": 0.9, "The valid": 0.5})
    (excerpt,) = focused_excerpts(found, groups=1, neighbours=1)
    # The term's own line is the first sentence's neighbour: given once, as it stands.
    assert excerpt.text.startswith("checkpoint_timeout (integer) Maximum time between")
    assert excerpt.text.count("checkpoint_timeout") == 1


def test_each_definition_in_an_excerpt_brings_its_own_term() -> None:
    found = scored_page(SETTINGS, {"Maximum time between": 0.9, "The default is 0.9": 0.8})
    (excerpt,) = focused_excerpts(found, groups=1, neighbours=0)
    assert excerpt.text == (
        "checkpoint_timeout (integer): Maximum time between automatic WAL checkpoints. … "
        "checkpoint_completion_target (floating point): The default is 0.9."
    )
