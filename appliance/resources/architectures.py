"""What a model's architecture (its GGUF's `general.architecture`) tells before the load.

llama.cpp runs sentence encoders (BERT and its kin, Gemma's embedding model) without a KV cache
and without an output layer: `llama_model::create_memory` gives them no memory module, and their
`llama_decode` runs the whole batch at once as `llama_encode`, with every token an output. Such a
model can only be an embedding model, and it takes no KV cache memory.
"""

from __future__ import annotations

# llama.cpp's create_memory list (src/llama-model.cpp) less its diffusion and vocoder models,
# which EIE does not serve at all.
ENCODER_ARCHITECTURES = frozenset({
    "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert", "eurobert",
    "modern-bert", "gemma-embedding",
})


def is_encoder(architecture: str) -> bool:
    """True for an architecture llama.cpp runs as an encoder: no KV cache, no logits."""
    return architecture in ENCODER_ARCHITECTURES
