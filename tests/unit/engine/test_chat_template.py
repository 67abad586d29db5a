import pytest

from appliance.engine.chat_template import CHATML, GEMMA, ChatTemplate, TemplateError, default_template


def test_gemma_format_folds_system_into_first_user_turn():
    t = ChatTemplate(GEMMA, "<bos>", "<eos>")
    out = t.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}])
    assert out == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
                   "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")


def test_gemma_refuses_roles_out_of_order():
    t = ChatTemplate(GEMMA, "<bos>", "<eos>")
    with pytest.raises(TemplateError, match="alternate"):
        t.render([{"role": "assistant", "content": "x"}])


def test_turns_of_one_role_in_a_row_go_as_one_where_the_template_takes_only_alternating_turns():
    """Two user (or assistant) messages in a row, which every chat API allows, are one turn for
    Gemma's template (it raises on them), their texts joined by a blank line; a template that
    takes them (ChatML) gets them as they are; an order no merging mends still raises."""
    t = ChatTemplate(GEMMA, "<bos>", "<eos>")
    out = t.render([{"role": "user", "content": "Hi"}, {"role": "user", "content": "again"},
                    {"role": "assistant", "content": "Hello"}, {"role": "assistant", "content": "there"},
                    {"role": "user", "content": "Bye"}])
    assert out == ("<bos><start_of_turn>user\nHi\n\nagain<end_of_turn>\n<start_of_turn>model\nHello\n\nthere"
                   "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    prefilled = t.render([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                          {"role": "assistant", "content": "and"}], continue_final=True)
    assert prefilled.endswith("<start_of_turn>model\nHello\n\nand")
    assert ChatTemplate(CHATML, "", "").render([{"role": "user", "content": "Hi"}, {"role": "user", "content": "again"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(TemplateError, match="alternate"):
        t.render([{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}])


def test_default_template_choice():
    assert default_template({"tokenizer.chat_template": "X"}) == "X"
    assert default_template({"general.architecture": "gemma3"}) == GEMMA
    assert default_template({"general.architecture": "llama"}) == CHATML
    assert ChatTemplate(CHATML, "", "").render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_sandbox_blocks_attribute_escape():
    t = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}", "", "")
    with pytest.raises(TemplateError, match="unsafe"):
        t.render([{"role": "user", "content": "x"}])


def test_templates_may_use_loop_controls_and_generation_blocks():
    """Hugging Face's renderer has {% break %}/{% continue %} (Reka's templates use them) and
    {% generation %} (LFM2.5's, Laguna's): a block marking the assistant's text, rendered as is."""
    source = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
              "{% if m.content == 'stop' %}{% break %}{% endif %}"
              "{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]{% endgeneration %}"
              "{% else %}{{ m.content }}{% endif %}{% endfor %}")
    out = ChatTemplate(source, "", "").render([{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                                               {"role": "assistant", "content": "b"},
                                               {"role": "user", "content": "stop"}, {"role": "user", "content": "c"}])
    assert out == "a[b]"


def test_a_template_may_grow_and_shrink_its_own_lists_but_not_change_dicts():
    """Kimi K2's templates queue their calls' ids (append, then pop(0)), as llama.cpp's renderer
    allows; other changes (a dict's update) stay refused, as in Hugging Face's sandbox."""
    source = ("{% set ns = namespace(ids=[]) %}{% for m in messages %}{% set _ = ns.ids.append(m.content) %}{% endfor %}"
              "{{ ns.ids.pop(0) }}|{{ ns.ids | join(',') }}")
    out = ChatTemplate(source, "", "").render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                                               {"role": "user", "content": "c"}])
    assert out == "a|b,c"
    with pytest.raises(TemplateError, match="unsafe"):
        ChatTemplate("{% set _ = messages[0].update({'x': 1}) %}", "", "").render([{"role": "user", "content": "a"}])


def test_tojson_writes_a_filters_lazy_sequence_as_its_list():
    """llama.cpp's DeepSeek R1 template lists the tools with `tools | map(attribute='function') | tojson`."""
    out = ChatTemplate("{{ tools | map(attribute='function') | tojson }}", "", "").render(
        [{"role": "user", "content": "x"}], tools=[{"type": "function", "function": {"name": "f"}}])
    assert out == '[{"name": "f"}]'
