"""The appliance build, end to end: build.spec frozen from the setup build (PyInstaller onedir),
started with an empty environment (`env -i`) from `/`, serving the default preset's real models:
/health, a chat completion, and a clean exit on SIGTERM. Also: what the bundle holds (llama.cpp's
libraries and the backend modules where llama_cpp looks for them, no GPU driver library) and
`eie doctor` from the frozen executable."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from appliance.resources import file_facts
from conftest import ROOT, build_spec_host_libs, free_port

HOST_LIBS = build_spec_host_libs()


def freeze(dest: Path) -> Path:
    """`make binary`'s PyInstaller run, into `dest`; returns the executable."""
    subprocess.run([sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
                    "--distpath", str(dest / "dist"), "--workpath", str(dest / "work"), str(ROOT / "build.spec")],
                   cwd=ROOT, check=True, timeout=1200, capture_output=True)
    return dest / "dist" / "eie" / "eie"


@pytest.fixture(scope="module")
def frozen(tmp_path_factory) -> Path:
    return freeze(tmp_path_factory.mktemp("freeze"))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_bundle_holds_llama_cpp_and_its_backend_modules_but_no_driver(frozen):
    lib = frozen.parent / "_internal" / "llama_cpp" / "lib"
    names = {p.name for p in lib.iterdir()}
    assert {"libllama.so", "libggml.so", "libggml-base.so"} <= names
    assert any(n.startswith("libggml-cpu") and n.endswith(".so") for n in names)
    everything = [p.name for p in frozen.parent.rglob("*.so*")]
    assert not [n for n in everything if HOST_LIBS.match(n)]
    # one copy of each ggml library, in llama_cpp/lib (PyInstaller links the sonames it collects
    # as dependencies to them): a second libggml would have its own backend registry
    assert not [p for p in frozen.parent.rglob("libggml*")
                if p.parent != lib and not (p.is_symlink() and p.resolve().parent == lib.resolve())]


def unloadable_module(tmp: Path, lib: Path) -> Path:
    """A backend module in `lib` that needs a library the loader cannot find, as a CUDA module does
    on a host without the driver (libcuda.so.1)."""
    (tmp / "absent.c").write_text("int eie_absent(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libeie-absent.so.1", "-o", str(tmp / "libeie-absent.so"),
                    str(tmp / "absent.c")], check=True)
    (tmp / "module.c").write_text("int eie_absent(void);\nint ggml_backend_score(void) { return eie_absent(); }\n")
    module = lib / "libggml-eietest.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(module), str(tmp / "module.c"), "-L", str(tmp),
                    "-leie-absent"], check=True)
    return module


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_frozen_doctor_from_an_empty_environment(frozen, tmp_path):
    # PyInstaller's ctypes says only "not found when the application was frozen" for a module that
    # does not load; doctor must show the loader's reason instead
    module = unloadable_module(tmp_path, frozen.parent / "_internal" / "llama_cpp" / "lib")
    try:
        out = subprocess.run(["env", "-i", str(frozen), "doctor", "--json"], cwd="/", capture_output=True, text=True,
                             timeout=120, check=True)
    finally:
        module.unlink()
    r = json.loads(out.stdout)
    assert r["frozen"] is True
    cpu = next(b for b in r["backends"] if b["name"] == "cpu")
    assert cpu["registered"] == "CPU" and cpu["score"] > 0
    assert "/_internal/llama_cpp/lib/" in cpu["chosen"]
    assert "turbo3" in r["kv_types"]
    broken = next(b for b in r["backends"] if b["name"] == "eietest")
    assert broken["chosen"] is None
    assert "libeie-absent.so.1: cannot open shared object file" in broken["candidates"][0]["error"], broken


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_frozen_binary_serves_the_default_preset_from_an_empty_environment(frozen, tmp_path, real_models):
    preset = ROOT / "presets" / "fixed-appliance.yaml"
    config = yaml.safe_load(preset.read_text())
    config["model_dir"] = str((preset.parent / config["model_dir"]).resolve())
    port = free_port()
    # an empty cache: the GGUF headers are read by the binary run again as a child (engine/gguf_header.py)
    config["server"] = {**config.get("server", {}), "host": "127.0.0.1", "port": port,
                        "cache_dir": str(tmp_path / "cache")}
    path = tmp_path / "eie.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(tmp_path / "frozen.log", "wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(["env", "-i", str(frozen), "serve", "--config", str(path)], cwd="/",
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            assert proc.poll() is None, (tmp_path / "frozen.log").read_text()
            assert time.monotonic() - t0 < 120, "not healthy in 120 s"
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        print(f"frozen: exec to /health 200 in {time.monotonic() - t0:.2f}s")
        r = httpx.post(base + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2-135m", "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["message"]["content"].strip()
        assert body["usage"]["completion_tokens"] > 0
        # the other APIs' modules are in the bundle too (Ollama's model list reads weight types with gguf)
        tags = httpx.get(base + "/api/tags", timeout=60).json()["models"]
        assert {m["details"]["quantization_level"] for m in tags} == {"Q4_1", "Q4_K_M"}
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        log.close()
    text = (tmp_path / "frozen.log").read_text(errors="replace")
    assert rc == 0, text
    assert "Traceback" not in text, text
    assert len(list((tmp_path / "cache" / file_facts.GGUF_SHAPE).iterdir())) == 2  # both models' headers
