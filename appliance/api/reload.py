"""What a config reload may change live, and what needs a restart."""

from __future__ import annotations

from dataclasses import dataclass, field

from msgspec import structs

from ..config import LIVE_MODEL_FIELDS, Config, live_fields


@dataclass
class ReloadPlan:
    config: Config  # the config to run with: live changes applied, restart-only ones kept as they were
    applied: list[str] = field(default_factory=list)
    restart_required: list[str] = field(default_factory=list)
    added_models: list[str] = field(default_factory=list)


def plan_reload(old: Config, new: Config) -> ReloadPlan:
    plan = ReloadPlan(config=old)
    server = old.server
    for key in ("limits", "responses", "api_keys", "admin_keys", "api_key_file", "metrics_auth", "drain_grace_s",
                "stream_keepalive_s", "files", "cors_origins"):
        if getattr(old.server, key) != getattr(new.server, key):
            server = structs.replace(server, **{key: getattr(new.server, key)})
            plan.applied.append(f"server.{key}")
    for key in ("host", "port", "state_dir", "cache_dir"):
        if getattr(old.server, key) != getattr(new.server, key):
            plan.restart_required.append(f"server.{key}")
    if old.server.batches.concurrent_requests != new.server.batches.concurrent_requests:  # read per batch step
        server = structs.replace(server, batches=structs.replace(
            server.batches, concurrent_requests=new.server.batches.concurrent_requests))
        plan.applied.append("server.batches.concurrent_requests")
    if old.server.batches.preempt != new.server.batches.preempt:  # each runner takes it when it is made
        plan.restart_required.append("server.batches.preempt")
    if old.server.responses.persist != new.server.responses.persist:
        plan.restart_required.append("server.responses.persist")
        server = structs.replace(server, responses=structs.replace(server.responses,
                                                                   persist=old.server.responses.persist))
    policy = old.policy
    for key in ("keep_alive_s", "load_timeout_s"):
        if getattr(old.policy, key) != getattr(new.policy, key):
            policy = structs.replace(policy, **{key: getattr(new.policy, key)})
            plan.applied.append(f"policy.{key}")
    for key in ("strategy", "plugin_options", "plugin_dir"):
        if getattr(old.policy, key) != getattr(new.policy, key):
            plan.restart_required.append(f"policy.{key}")
    models = list(old.models)
    old_by_name = {m.name: m for m in old.models}
    new_by_name = {m.name: m for m in new.models}
    for name, m in new_by_name.items():
        if name not in old_by_name and old.model_dir != new.model_dir:
            # its files are under the new model_dir, which takes a restart (running with the old
            # one, it would load another file or none)
            plan.restart_required.append(f"models.{name} (added under the new model_dir)")
            continue
        if name not in old_by_name:
            models.append(m)
            plan.added_models.append(name)
            plan.applied.append(f"models.{name} (added)")
            continue
        was = old_by_name[name]
        live = live_fields(was, m)
        if old.model_path(was) != new.model_path(m) or structs.replace(m, path="") != structs.replace(live, path=""):
            plan.restart_required.append(f"models.{name}")
        elif live != was:
            models[models.index(was)] = live
            plan.applied += [f"models.{name}.{f}" for f in LIVE_MODEL_FIELDS if getattr(live, f) != getattr(was, f)]
            plan.applied += [f"models.{name}.lora[{i}].scale" for i, (a, b) in enumerate(zip(was.lora, live.lora))
                             if a.scale != b.scale]
    for name in old_by_name:
        if name not in new_by_name:
            plan.restart_required.append(f"models.{name} (removed)")
    groups = old.groups
    if old.groups != new.groups:
        known = {m.name for m in models} | {a.name for m in models for a in m.lora}
        if all(set(g.models) <= known for g in new.groups):
            groups = new.groups
            plan.applied.append("groups")
        else:
            plan.restart_required.append("groups (they name models that are not running)")
    vram = old.vram
    if old.vram != new.vram:
        vram = new.vram
        plan.applied.append("vram")
    # (inference.kv_cache and .speculative reach each model's own settings: a model change above)
    inference = old.inference
    if old.inference.kv_adaptive != new.inference.kv_adaptive:
        inference = structs.replace(inference, kv_adaptive=new.inference.kv_adaptive)
        plan.applied.append("inference.kv_adaptive")
    if old.server.log_format != new.server.log_format:
        plan.restart_required.append("server.log_format")
    if old.audit != new.audit:
        plan.restart_required.append("audit")
    if old.model_dir != new.model_dir:
        plan.restart_required.append("model_dir")
    plan.config = structs.replace(old, server=server, policy=policy, models=models, groups=groups, vram=vram,
                                  inference=inference)
    return plan
