"""Chat templates in the two shapes reasoning models have, for SmolLM2 (test_reasoning.py,
test_responses_api.py): Qwen3's (the model opens `<think>` itself, and `enable_thinking: false`
closes an empty block in the prompt) and DeepSeek-R1's (the prompt opens the block). THINK is a
grammar that makes the untrained model write a block."""

TURNS = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n")
QWEN3_STYLE = TURNS + ("{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
                       "{% endif %}{% endif %}")
# DeepSeek-R1's shape: the prompt opens the block, and earlier answers lose theirs
OPENED = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n"
          "{{ m.content.split('</think>')[-1] if m.role == 'assistant' else m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
THINK = 'root ::= "<think>" [a-z ]{10,60} "</think>" [A-Za-z ]{10,60}'

# gpt-oss's harmony shape: the model writes its analysis channel, then its final one; the template
# takes `reasoning_effort` (HARMONY_TOKENS: a SmolLM2 copy's tokens for its control tokens; with <|return|> and
# <|call|> there, llama.cpp does not end generation at <|end|>, as for gpt-oss)
HARMONY_TOKENS = {6: "<|channel|>", 7: "<|message|>", 8: "<|end|>", 9: "<|start|>", 10: "<|return|>", 11: "<|call|>",
                  12: "<|constrain|>"}
HARMONY_STYLE = ("<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>"
                 "{%- for m in messages %}{% if m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
                 "{{ m.content }}<|end|>{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}"
                 "{% endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"
                 "{# thinking: <|start|>assistant<|channel|>analysis<|message|>...<|end|> #}")
HARMONY = ('root ::= <[6]> "analysis" <[7]> [a-z ]{10,40} <[8]> <[9]> "assistant" <[6]> "final" <[7]> '
           '[A-Za-z ]{5,30}')
HARMONY_OPENED = HARMONY_STYLE.replace("<|start|>assistant{% endif %}",
                                      "<|start|>assistant<|channel|>analysis<|message|>{% endif %}")
