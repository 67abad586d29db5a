"""KV cache formats: TurboQuant codebooks and codec."""
