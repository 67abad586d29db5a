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
