"""A model's runner as a LoRA adapter's name serves it: the same runner, context and queue,
whose requests decode with the adapter (engine/adapters.py) and whose name is the adapter's."""

from __future__ import annotations

import dataclasses
from typing import Any

from .adapters import AdapterSet
from .runner import GenerationRequest, Handle, ModelRunner, Sink


class AdaptedRunner:
    """Everything but `name`, `submit` and `submit_many` is the base runner's."""

    def __init__(self, base: ModelRunner, name: str, adapters: AdapterSet):
        self.base = base
        self.name = name
        self.adapter_set = adapters

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.base, attr)

    def submit(self, req: GenerationRequest, sink: Sink) -> Handle:
        return self.submit_many([req], [sink])[0]

    def submit_many(self, reqs: list[GenerationRequest], sinks: list[Sink]) -> list[Handle]:
        # replace() keeps each prompt list object, by which the runner finds shared prefills
        return self.base.submit_many([dataclasses.replace(r, adapters=self.adapter_set) for r in reqs], sinks)
