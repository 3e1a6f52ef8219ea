"""A question about the editor's program is searched with the commands it calls."""

from services.retriever.logic import with_editor_commands


def test_the_editors_commands_join_the_query_once_each_in_order() -> None:
    editor = "// hash it\naddParam(p, x)\nh = encodeSHA256(x, y)\naddParam(q, z)\nnot code\n"
    assert with_editor_commands("explain this", editor) == "explain this addParam encodeSHA256"


def test_an_editor_without_code_leaves_the_query_alone() -> None:
    assert with_editor_commands("explain this", "Plain prose.") == "explain this"
